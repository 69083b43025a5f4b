#include "planner/schedule/schedules.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"

namespace dynapipe::planner {
namespace {

std::vector<std::vector<int>> ChunksPerDevice(const PipelineTimes& t) {
  std::vector<std::vector<int>> out(t.num_devices);
  for (int c = 0; c < t.num_chunks; ++c) out[t.chunk_device[c]].push_back(c);
  return out;
}

// Warm-up forwards, then forward/backward alternation (forward first in
// interleaved schedules, backward first in plain 1F1B), then the remaining
// backwards.
std::vector<SimOp> Alternate(const std::vector<SimOp>& fw, const std::vector<SimOp>& bw, size_t warmup,
                             bool forward_first) {
  std::vector<SimOp> out;
  out.reserve(fw.size() + bw.size());
  warmup = std::min(warmup, fw.size());
  size_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(fw[f]);
  while (f < fw.size()) {
    if (forward_first) {
      out.push_back(fw[f++]);
      if (b < bw.size()) out.push_back(bw[b++]);
    } else {
      if (b < bw.size()) out.push_back(bw[b++]);
      out.push_back(fw[f++]);
    }
  }
  while (b < bw.size()) out.push_back(bw[b++]);
  return out;
}

}  // namespace

const char* ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved_1f1b";
    case ScheduleKind::kWaitFreeCyclic: return "wait_free_cyclic";
  }
  return "?";
}

bool ScheduleApplies(ScheduleKind kind, const PipelineTimes& t) {
  const auto per_device = ChunksPerDevice(t);
  switch (kind) {
    case ScheduleKind::kOneFOneB:
      for (const auto& c : per_device) {
        if (c.size() != 1) return false;
      }
      for (int c = 0; c < t.num_chunks; ++c) {
        if (t.chunk_device[c] != c) return false;
      }
      return true;
    case ScheduleKind::kInterleaved1F1B: {
      if (t.num_chunks % t.num_devices != 0 || t.num_chunks == t.num_devices) return false;
      for (int c = 0; c < t.num_chunks; ++c) {
        if (t.chunk_device[c] != c % t.num_devices) return false;
      }
      return true;
    }
    case ScheduleKind::kWaitFreeCyclic: return true;
  }
  return false;
}

absl::StatusOr<DeviceOrders> OneFOneB(const PipelineTimes& t) {
  if (!ScheduleApplies(ScheduleKind::kOneFOneB, t)) {
    return absl::InvalidArgumentError("1f1b needs exactly one model chunk per device, in pipeline order");
  }
  DeviceOrders orders(t.num_devices);
  for (int d = 0; d < t.num_devices; ++d) {
    std::vector<SimOp> fw, bw;
    for (int m = 0; m < t.num_mb; ++m) {
      fw.push_back({SimOp::kForward, m, d});
      bw.push_back({SimOp::kBackward, m, d});
    }
    orders[d] = Alternate(fw, bw, static_cast<size_t>(t.num_devices - d), /*forward_first=*/false);
  }
  return orders;
}

absl::StatusOr<DeviceOrders> Interleaved1F1B(const PipelineTimes& t) {
  if (!ScheduleApplies(ScheduleKind::kInterleaved1F1B, t)) {
    return absl::InvalidArgumentError(
        "interleaved_1f1b needs several chunks per device with chunk c on device c % devices");
  }
  const int D = t.num_devices, v = t.num_chunks / D;
  DeviceOrders orders(D);
  for (int d = 0; d < D; ++d) {
    std::vector<SimOp> fw, bw;
    for (int g = 0; g < t.num_mb; g += D) {
      const int end = std::min(t.num_mb, g + D);
      for (int j = 0; j < v; ++j) {
        for (int m = g; m < end; ++m) fw.push_back({SimOp::kForward, m, j * D + d});
      }
      for (int j = v - 1; j >= 0; --j) {
        for (int m = g; m < end; ++m) bw.push_back({SimOp::kBackward, m, j * D + d});
      }
    }
    orders[d] = Alternate(fw, bw, static_cast<size_t>((D - d - 1) * 2 + (v - 1) * D), /*forward_first=*/true);
  }
  return orders;
}

absl::StatusOr<DeviceOrders> WaitFreeCyclic(const PipelineTimes& t, double memory_limit_mb) {
  const int D = t.num_devices, C = t.num_chunks, M = t.num_mb, K = 2 * C;
  // Chain position k: forward of chunk k for k < C, backward of chunk 2C-1-k after.
  auto op_at = [C](int mb, int k) {
    return k < C ? SimOp{SimOp::kForward, mb, k} : SimOp{SimOp::kBackward, mb, 2 * C - 1 - k};
  };
  std::vector<std::deque<int>> queue(static_cast<size_t>(K));  // per chain position (devices own positions)
  for (int m = 0; m < M; ++m) queue[0].push_back(m);
  std::vector<std::vector<int>> positions(D);
  for (int k = 0; k < K; ++k) positions[t.chunk_device[op_at(0, k).chunk]].push_back(k);

  DeviceOrders orders(D);
  std::vector<double> mem(t.static_mb.begin(), t.static_mb.end());
  std::vector<int> newest_fw(D, 0);  // highest micro-batch whose forward ran here
  std::vector<std::pair<int, int>> released;  // (k, mb) visible next cycle
  size_t remaining = static_cast<size_t>(M) * K;
  std::vector<SimOp> fw, bw;
  while (remaining > 0) {
    bool progress = false;
    released.clear();
    for (int d = 0; d < D; ++d) {
      fw.clear();
      bw.clear();
      for (int k : positions[d]) {
        if (queue[k].empty()) continue;
        const SimOp op = op_at(queue[k].front(), k);
        (op.kind == SimOp::kForward ? fw : bw).push_back(op);
      }
      auto by_mb = [](const SimOp& a, const SimOp& b) { return a.mb != b.mb ? a.mb < b.mb : a.chunk < b.chunk; };
      std::sort(fw.begin(), fw.end(), by_mb);
      std::sort(bw.begin(), bw.end(), by_mb);
      for (size_t i = 0; i < std::max(fw.size(), bw.size()); ++i) {
        for (int pass = 0; pass < 2; ++pass) {
          const std::vector<SimOp>& list = pass == 0 ? bw : fw;
          if (i >= list.size()) continue;
          const SimOp op = list[i];
          const size_t at = t.At(op.mb, op.chunk);
          if (op.kind == SimOp::kForward && op.mb > newest_fw[d] &&
              mem[d] + t.stored_mb[at] + t.peak_mb[at] > memory_limit_mb) {
            continue;  // admission: no new micro-batch while memory is short
          }
          const int k = op.kind == SimOp::kForward ? op.chunk : 2 * C - 1 - op.chunk;
          queue[k].pop_front();
          orders[d].push_back(op);
          if (op.kind == SimOp::kForward) {
            mem[d] += t.stored_mb[at];
            newest_fw[d] = std::max(newest_fw[d], op.mb);
          } else {
            mem[d] -= t.stored_mb[at];
          }
          if (k + 1 < K) released.push_back({k + 1, op.mb});
          --remaining;
          progress = true;
        }
      }
    }
    for (const auto& [k, mb] : released) queue[k].push_back(mb);
    if (!progress) {
      return absl::FailedPreconditionError(absl::StrCat("wait_free_cyclic: memory limit ", memory_limit_mb,
                                                        " MB admits no further micro-batch"));
    }
  }
  return orders;
}

absl::StatusOr<DeviceOrders> MakeSchedule(ScheduleKind kind, const PipelineTimes& t, double memory_limit_mb) {
  switch (kind) {
    case ScheduleKind::kOneFOneB: return OneFOneB(t);
    case ScheduleKind::kInterleaved1F1B: return Interleaved1F1B(t);
    case ScheduleKind::kWaitFreeCyclic: return WaitFreeCyclic(t, memory_limit_mb);
  }
  return absl::InvalidArgumentError("unknown schedule");
}

}  // namespace dynapipe::planner
