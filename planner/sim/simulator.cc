#include "planner/sim/simulator.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

absl::StatusOr<SimResult> Simulate(const PipelineTimes& t, const DeviceOrders& orders, bool record) {
  const int D = t.num_devices, C = t.num_chunks, M = t.num_mb;
  if (static_cast<int>(orders.size()) != D) {
    return absl::InvalidArgumentError(absl::StrCat("schedule has ", orders.size(), " devices, expected ", D));
  }
  constexpr double kUnknown = -1;
  // Arrival time of the input of each op: fw_in[mb,c] for F(mb,c), bw_in for B(mb,c).
  std::vector<double> fw_in(static_cast<size_t>(M) * C, kUnknown), bw_in(static_cast<size_t>(M) * C, kUnknown);
  std::vector<uint8_t> done(static_cast<size_t>(M) * C * 2, 0);
  for (int m = 0; m < M; ++m) fw_in[t.At(m, 0)] = 0;

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

  SimResult result;
  result.peak_mb.assign(D, 0);
  if (record) result.ops.assign(D, {});
  std::vector<size_t> next(D, 0);
  std::vector<double> compute_free(D, 0), comm_free(D, 0), mem(D);
  for (int d = 0; d < D; ++d) mem[d] = result.peak_mb[d] = t.static_mb[d];

  size_t executed = 0;
  while (executed < total) {
    bool progress = false;
    for (int d = 0; d < D; ++d) {
      while (next[d] < orders[d].size()) {
        const SimOp op = orders[d][next[d]];
        const size_t i = t.At(op.mb, op.chunk);
        const double ready = op.kind == SimOp::kForward ? fw_in[i] : bw_in[i];
        if (ready == kUnknown) break;
        const double start = std::max(ready, compute_free[d]);
        const double end = start + (op.kind == SimOp::kForward ? t.fw_ms[i] : t.bw_ms[i]);
        compute_free[d] = end;
        result.peak_mb[d] = std::max(result.peak_mb[d], mem[d] + t.peak_mb[i]);
        mem[d] += op.kind == SimOp::kForward ? t.stored_mb[i] : -t.stored_mb[i];
        if (record) result.ops[d].push_back({op, start, end});

        // Hand the output to the next op in the micro-batch's chain.
        int next_chunk;
        double* next_in;
        double comm_ms;
        if (op.kind == SimOp::kForward) {
          const bool last = op.chunk == C - 1;
          next_chunk = last ? op.chunk : op.chunk + 1;
          next_in = last ? &bw_in[i] : &fw_in[t.At(op.mb, next_chunk)];
          comm_ms = last ? 0 : t.comm_fw_ms[i];
        } else if (op.chunk > 0) {
          next_chunk = op.chunk - 1;
          next_in = &bw_in[t.At(op.mb, next_chunk)];
          comm_ms = t.comm_bw_ms[t.At(op.mb, next_chunk)];
        } else {
          next_chunk = -1;
          next_in = nullptr;
          comm_ms = 0;
        }
        if (next_in != nullptr) {
          const int dst = t.chunk_device[next_chunk];
          if (dst == d) {
            *next_in = end;
          } else {
            const double cs = std::max(end, comm_free[d]);
            const double ce = cs + comm_ms;
            comm_free[d] = ce;
            *next_in = ce;
            if (record) result.transfers.push_back({d, dst, op, cs, ce});
          }
        }
        result.makespan_ms = std::max(result.makespan_ms, end);
        ++next[d];
        ++executed;
        progress = true;
      }
    }
    if (!progress) {
      std::string stuck;
      for (int d = 0; d < D && stuck.size() < 200; ++d) {
        if (next[d] < orders[d].size()) {
          const SimOp& op = orders[d][next[d]];
          absl::StrAppend(&stuck, " device ", d, " waits on ", op.kind ? "B" : "F", op.mb, "/c", op.chunk, ";");
        }
      }
      return absl::FailedPreconditionError(absl::StrCat("schedule deadlocks:", stuck));
    }
  }
  return result;
}

std::string ChromeTrace(const SimResult& r, const std::string& label, int pid_offset) {
  std::string out;
  auto event = [&out](const std::string& name, int pid, int tid, double start_ms, double end_ms) {
    absl::StrAppendFormat(&out, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                          out.empty() ? "" : ",\n", name, pid, tid, start_ms * 1e3, (end_ms - start_ms) * 1e3);
  };
  for (size_t d = 0; d < r.ops.size(); ++d) {
    const int pid = pid_offset + static_cast<int>(d);
    absl::StrAppendFormat(&out, "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"%s device %d\"}}",
                          out.empty() ? "" : ",\n", pid, label, d);
    for (const OpTiming& o : r.ops[d]) {
      event(absl::StrCat(o.op.kind ? "B" : "F", o.op.mb, " c", o.op.chunk), pid, 0, o.start_ms, o.end_ms);
    }
  }
  for (const Transfer& x : r.transfers) {
    event(absl::StrCat(x.producer.kind ? "grad " : "act ", x.producer.mb, " -> ", x.dst), pid_offset + x.src, 1,
          x.start_ms, x.end_ms);
  }
  return out;
}

}  // namespace dynapipe::planner
