#pragma once

// Pipeline schedules: each turns an iteration's micro-batches into one op
// order per device, which the simulator (and later the executors) follow.

#include <limits>

#include "absl/status/statusor.h"
#include "planner/sim/simulator.h"

namespace dynapipe::planner {

enum class ScheduleKind { kOneFOneB = 0, kInterleaved1F1B = 1, kWaitFreeCyclic = 2 };
inline constexpr int kNumScheduleKinds = 3;

const char* ScheduleName(ScheduleKind kind);

// Whether `kind` applies to this layout: 1F1B needs one chunk per device;
// interleaved 1F1B needs v > 1 chunks per device with chunk c on device
// c % num_devices; wait-free cyclic takes any layout.
bool ScheduleApplies(ScheduleKind kind, const PipelineTimes& t);

// 1F1B: device at pipeline position p runs min(D - p, M) forwards, then
// alternates backward/forward, then drains the backwards.
absl::StatusOr<DeviceOrders> OneFOneB(const PipelineTimes& t);

// Megatron-style interleaved 1F1B: forwards go in groups of D micro-batches,
// chunk by chunk; (D - d - 1) * 2 + (v - 1) * D warm-up forwards on device d,
// then forward/backward alternate.
absl::StatusOr<DeviceOrders> Interleaved1F1B(const PipelineTimes& t);

// DynaPipe's wait-free cyclic schedule. Records an order by running the
// micro-batches' op chains in synchronous cycles: in each cycle every device
// takes the head of each of its per-stage queues (backward ops first), and a
// forward op that would start a new micro-batch on the device is held back
// while the device's memory (model state + stored activations + this op's
// stored and transient memory) would pass `memory_limit_mb`. Outputs become
// visible the next cycle. The recorded order is then replayed event-driven,
// without lock-step (that is the simulator's job). FAILED_PRECONDITION if the
// limit stops all progress.
absl::StatusOr<DeviceOrders> WaitFreeCyclic(const PipelineTimes& t,
                                            double memory_limit_mb = std::numeric_limits<double>::infinity());

// Dispatches to the three functions above.
absl::StatusOr<DeviceOrders> MakeSchedule(ScheduleKind kind, const PipelineTimes& t,
                                          double memory_limit_mb = std::numeric_limits<double>::infinity());

}  // namespace dynapipe::planner
