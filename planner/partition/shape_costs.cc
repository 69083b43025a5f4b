#include "planner/partition/shape_costs.h"

#include <algorithm>

namespace dynapipe::planner {

absl::StatusOr<const ShapeCost*> ShapeCosts::Get(const Shape& shape, Recompute r) {
  const uint64_t key = Key(shape, r);
  {
    MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
    if (auto it = errors_.find(key); it != errors_.end()) return it->second;
  }
  const PipelineModel& pm = *model_;
  auto cost = std::make_unique<ShapeCost>();
  cost->chunks.resize(pm.num_chunks());
  const absl::Status s = pm.ChunkCosts(shape, r, std::span<ChunkCost>(cost->chunks));
  MutexLock lock(&mu_);
  if (!s.ok()) {
    errors_.emplace(key, s);
    return s;
  }
  const int D = pm.num_devices();
  std::vector<double> time(D, 0);
  cost->stored_mb.assign(D, 0);
  cost->peak_mb.assign(D, 0);
  for (int c = 0; c < pm.num_chunks(); ++c) {
    const int d = pm.chunks()[c].device;
    const ChunkCost& cc = cost->chunks[c];
    time[d] += cc.fw_ms + cc.bw_ms;
    cost->stored_mb[d] += cc.stored_mb;
    cost->peak_mb[d] = std::max(cost->peak_mb[d], cc.peak_mb);
  }
  cost->time_ms = *std::max_element(time.begin(), time.end());
  auto [it, inserted] = cache_.emplace(key, std::move(cost));
  return it->second.get();
}

bool ShapeCosts::Fits(const ShapeCost& c, bool preferred) const {
  const PipelineModel& pm = *model_;
  const int D = pm.num_devices();
  for (int d = 0; d < D; ++d) {
    // 1F1B keeps D - d micro-batches in flight on pipeline device d.
    const int in_flight = preferred ? D - d : 1;
    if (pm.StaticMb(d) + in_flight * c.stored_mb[d] + c.peak_mb[d] > pm.memory().limit_mb) return false;
  }
  return true;
}

}  // namespace dynapipe::planner
