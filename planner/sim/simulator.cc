#include "planner/sim/simulator.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "src/common/chrome_trace.h"

namespace dynapipe::planner {

void PipelineTimes::Resize(int devices, int chunks, int mbs) {
  num_devices = devices;
  num_chunks = chunks;
  num_mb = mbs;
  const size_t n = static_cast<size_t>(chunks) * mbs;
  for (auto* v : {&fw_ms, &bw_ms, &stored_mb, &peak_mb, &comm_fw_ms, &comm_bw_ms}) v->assign(n, 0.0);
  static_mb.assign(devices, 0.0);
  chunk_device.resize(chunks);
}

namespace {

constexpr double kUnknown = -1;

// INVALID_ARGUMENT unless every (mb, chunk) forward and backward appears
// exactly once, on the chunk's device; the number of ops otherwise.
absl::StatusOr<size_t> CheckOrders(const PipelineTimes& t, const DeviceOrders& orders) {
  const int D = t.num_devices, C = t.num_chunks, M = t.num_mb;
  if (static_cast<int>(orders.size()) != D) {
    return absl::InvalidArgumentError(absl::StrCat("schedule has ", orders.size(), " devices, expected ", D));
  }
  std::vector<uint8_t> done(static_cast<size_t>(M) * C * 2, 0);
  size_t total = 0;
  for (int d = 0; d < D; ++d) {
    total += orders[d].size();
    for (const SimOp& op : orders[d]) {
      if (op.mb < 0 || op.mb >= M || op.chunk < 0 || op.chunk >= C || t.chunk_device[op.chunk] != d) {
        return absl::InvalidArgumentError(absl::StrCat("schedule places ", op.kind ? "B" : "F", op.mb, " of chunk ",
                                                       op.chunk, " on device ", d));
      }
      uint8_t& seen = done[(t.At(op.mb, op.chunk)) * 2 + op.kind];
      if (seen) return absl::InvalidArgumentError(absl::StrCat("schedule repeats op mb ", op.mb, " chunk ", op.chunk));
      seen = 1;
    }
  }
  if (total != static_cast<size_t>(M) * C * 2) {
    return absl::InvalidArgumentError(absl::StrCat("schedule has ", total, " ops, expected ", M * C * 2));
  }
  return total;
}

// The simulation's state: per op the arrival of its input, per device the
// next op, when its compute and communication threads are free, and its memory.
class PipelineRun {
 public:
  PipelineRun(const PipelineTimes& t, const DeviceOrders& orders, bool record)
      : t_(t), orders_(orders), record_(record), D_(t.num_devices), C_(t.num_chunks),
        fw_in_(static_cast<size_t>(t.num_mb) * C_, kUnknown), bw_in_(static_cast<size_t>(t.num_mb) * C_, kUnknown),
        next_(D_, 0), compute_free_(D_, 0), comm_free_(D_, 0), mem_(D_) {
    for (int m = 0; m < t.num_mb; ++m) fw_in_[t.At(m, 0)] = 0;
    result_.peak_mb.assign(D_, 0);
    if (record) result_.ops.assign(D_, {});
    for (int d = 0; d < D_; ++d) mem_[d] = result_.peak_mb[d] = t.static_mb[d];
  }

  // Runs device d's ops in order until one's input has not arrived; how many ran.
  size_t RunDevice(int d) {
    size_t ran = 0;
    while (next_[d] < orders_[d].size()) {
      const SimOp op = orders_[d][next_[d]];
      const size_t i = t_.At(op.mb, op.chunk);
      const double ready = op.kind == SimOp::kForward ? fw_in_[i] : bw_in_[i];
      if (ready == kUnknown) break;
      Execute(d, op, i, ready);
      ++next_[d];
      ++ran;
    }
    return ran;
  }
  absl::Status Deadlock() const;
  SimResult& result() { return result_; }

 private:
  void Execute(int d, const SimOp& op, size_t i, double ready) {
    const double start = std::max(ready, compute_free_[d]);
    const double end = start + (op.kind == SimOp::kForward ? t_.fw_ms[i] : t_.bw_ms[i]);
    compute_free_[d] = end;
    result_.peak_mb[d] = std::max(result_.peak_mb[d], mem_[d] + t_.peak_mb[i]);
    mem_[d] += op.kind == SimOp::kForward ? t_.stored_mb[i] : -t_.stored_mb[i];
    if (record_) result_.ops[d].push_back({op, start, end});
    HandOff(d, op, i, end);
    result_.makespan_ms = std::max(result_.makespan_ms, end);
  }
  // Hands the output of `op` (ended at `end`) to the next op in the
  // micro-batch's chain, over the communication thread across devices.
  void HandOff(int d, const SimOp& op, size_t i, double end) {
    int next_chunk;
    double* next_in;
    double comm_ms;
    if (op.kind == SimOp::kForward) {
      const bool last = op.chunk == C_ - 1;
      next_chunk = last ? op.chunk : op.chunk + 1;
      next_in = last ? &bw_in_[i] : &fw_in_[t_.At(op.mb, next_chunk)];
      comm_ms = last ? 0 : t_.comm_fw_ms[i];
    } else if (op.chunk > 0) {
      next_chunk = op.chunk - 1;
      next_in = &bw_in_[t_.At(op.mb, next_chunk)];
      comm_ms = t_.comm_bw_ms[t_.At(op.mb, next_chunk)];
    } else {
      return;
    }
    const int dst = t_.chunk_device[next_chunk];
    if (dst == d) {
      *next_in = end;
    } else {
      const double cs = std::max(end, comm_free_[d]);
      const double ce = cs + comm_ms;
      comm_free_[d] = ce;
      *next_in = ce;
      if (record_) result_.transfers.push_back({d, dst, op, cs, ce});
    }
  }

  const PipelineTimes& t_;
  const DeviceOrders& orders_;
  const bool record_;
  const int D_, C_;
  // Arrival time of the input of each op: fw_in[mb,c] for F(mb,c), bw_in for B(mb,c).
  std::vector<double> fw_in_, bw_in_;
  std::vector<size_t> next_;
  std::vector<double> compute_free_, comm_free_, mem_;
  SimResult result_;
};

absl::Status PipelineRun::Deadlock() const {
  std::string stuck;
  for (int d = 0; d < D_ && stuck.size() < 200; ++d) {
    if (next_[d] < orders_[d].size()) {
      const SimOp& op = orders_[d][next_[d]];
      absl::StrAppend(&stuck, " device ", d, " waits on ", op.kind ? "B" : "F", op.mb, "/c", op.chunk, ";");
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("schedule deadlocks:", stuck));
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const PipelineTimes& t, const DeviceOrders& orders, bool record) {
  const absl::StatusOr<size_t> total = CheckOrders(t, orders);
  if (!total.ok()) return total.status();
  PipelineRun run(t, orders, record);
  size_t executed = 0;
  while (executed < *total) {
    bool progress = false;
    for (int d = 0; d < t.num_devices; ++d) {
      const size_t ran = run.RunDevice(d);
      executed += ran;
      progress = progress || ran > 0;
    }
    if (!progress) return run.Deadlock();
  }
  return std::move(run.result());
}

void AppendChromeTrace(const SimResult& r, const std::string& label, int pid_offset, ChromeTraceWriter* trace) {
  auto slice = [trace](const std::string& name, int pid, int tid, double start_ms, double end_ms) {
    trace->Complete(name, /*cat=*/"", pid, tid, start_ms * 1e3, (end_ms - start_ms) * 1e3);
  };
  for (size_t d = 0; d < r.ops.size(); ++d) {
    const int pid = pid_offset + static_cast<int>(d);
    trace->ProcessName(pid, absl::StrCat(label, " device ", d));
    for (const OpTiming& o : r.ops[d]) {
      slice(absl::StrCat(o.op.kind ? "B" : "F", o.op.mb, " c", o.op.chunk), pid, 0, o.start_ms, o.end_ms);
    }
  }
  for (const Transfer& x : r.transfers) {
    slice(absl::StrCat(x.producer.kind ? "grad " : "act ", x.producer.mb, " -> ", x.dst), pid_offset + x.src, 1,
          x.start_ms, x.end_ms);
  }
}

}  // namespace dynapipe::planner
