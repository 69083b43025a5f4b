#pragma once

// Discrete-event simulation of one pipeline iteration. Every device has a
// compute thread that runs its ops strictly in the given order, and a
// communication thread that sends the outputs of those ops, one transfer at a
// time, in the order they were produced (overlapping compute). A receiver's op
// can start once the transfer has arrived. Memory per device starts at the
// model state; an op's transient peak is added while it runs, a forward keeps
// its stored activations until the matching backward frees them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe {
class ChromeTraceWriter;  // src/common/chrome_trace.h
}  // namespace dynapipe

namespace dynapipe::planner {

struct SimOp {
  enum Kind : uint8_t { kForward = 0, kBackward = 1 };
  Kind kind = kForward;
  int mb = 0;     // micro-batch index
  int chunk = 0;  // pipeline position (model chunk)
  bool operator==(const SimOp&) const = default;
};

// Everything the simulator needs about one iteration, in flat arrays indexed
// [mb * num_chunks + chunk].
struct PipelineTimes {
  int num_devices = 0;
  int num_chunks = 0;
  int num_mb = 0;
  std::vector<int> chunk_device;  // chunk -> device
  std::vector<double> fw_ms, bw_ms, stored_mb, peak_mb;
  // Transfer times from chunk c to c+1 (activations) and from c+1 back to c
  // (gradients), at index [mb * num_chunks + c]; unused when both chunks share
  // a device.
  std::vector<double> comm_fw_ms, comm_bw_ms;
  std::vector<double> static_mb;  // per device

  void Resize(int devices, int chunks, int mbs);
  size_t At(int mb, int chunk) const { return static_cast<size_t>(mb) * num_chunks + chunk; }
};

using DeviceOrders = std::vector<std::vector<SimOp>>;

struct OpTiming {
  SimOp op;
  double start_ms = 0;
  double end_ms = 0;
};

// A transfer of one op's output to the device of the next op in the chain.
struct Transfer {
  int src = 0, dst = 0;
  SimOp producer;  // the op whose output travels
  double start_ms = 0, end_ms = 0;
};

struct SimResult {
  double makespan_ms = 0;
  std::vector<double> peak_mb;              // per device
  std::vector<std::vector<OpTiming>> ops;   // per device, in execution order (if recorded)
  std::vector<Transfer> transfers;          // in order of start time per sender (if recorded)
};

// Runs `orders` (one op list per device; every (mb, chunk) forward and
// backward exactly once, on the chunk's device). INVALID_ARGUMENT if the
// orders are malformed; FAILED_PRECONDITION if they deadlock.
absl::StatusOr<SimResult> Simulate(const PipelineTimes& times, const DeviceOrders& orders, bool record);

// Appends the recorded schedule to a Chrome trace (Perfetto /
// chrome://tracing): a process per device, "<label> device <d>", numbered
// from `pid_offset`, with its compute (thread 0) and sends (thread 1).
void AppendChromeTrace(const SimResult& result, const std::string& label, int pid_offset, ChromeTraceWriter* trace);

}  // namespace dynapipe::planner
