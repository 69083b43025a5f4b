#include "planner/partition/shape_costs.h"

#include <algorithm>

#include "src/common/status_macros.h"

namespace dynapipe::planner {

absl::StatusOr<std::unique_ptr<ShapeCost>> ShapeCosts::Compute(const Shape& shape, Recompute r) const {
  const PipelineModel& pm = *model_;
  auto cost = std::make_unique<ShapeCost>();
  cost->chunks.resize(pm.num_chunks());
  RETURN_IF_ERROR(pm.ChunkCosts(shape, r, std::span<ChunkCost>(cost->chunks)));
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
  cost->fits[0] = ComputeFits(*cost, false);
  cost->fits[1] = ComputeFits(*cost, true);
  return cost;
}

absl::StatusOr<std::shared_ptr<const ShapeCost>> ShapeCosts::Get(const Shape& shape, Recompute r) {
  if (!shape.padded()) {
    ASSIGN_OR_RETURN(std::unique_ptr<ShapeCost> cost, Compute(shape, r));
    return std::shared_ptr<const ShapeCost>(std::move(cost));
  }
  const int row = DenseRowIndex(shape, r);
  if (row >= 0) {
    if (const DenseRow* dense = dense_[row].load(std::memory_order_acquire)) {
      if (const ShapeCost* c = dense->slot[shape.mbs].load(std::memory_order_acquire)) return Borrowed(c);
    }
  }
  const uint64_t key = Key(shape, r);
  {
    MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return Borrowed(it->second.get());
    if (auto it = errors_.find(key); it != errors_.end()) return it->second;
  }
  absl::StatusOr<std::unique_ptr<ShapeCost>> cost = Compute(shape, r);
  MutexLock lock(&mu_);
  if (!cost.ok()) {
    errors_.emplace(key, cost.status());
    return cost.status();
  }
  auto [it, inserted] = cache_.emplace(key, std::move(*cost));
  const ShapeCost* result = it->second.get();
  if (row >= 0) {
    DenseRow* dense = dense_[row].load(std::memory_order_relaxed);
    if (dense == nullptr) {
      dense_rows_.push_back(std::make_unique<DenseRow>());
      dense = dense_rows_.back().get();
      for (auto& slot : dense->slot) slot.store(nullptr, std::memory_order_relaxed);
      dense_[row].store(dense, std::memory_order_release);
    }
    dense->slot[shape.mbs].store(result, std::memory_order_release);
  }
  return Borrowed(result);
}

bool ShapeCosts::ComputeFits(const ShapeCost& c, bool preferred) const {
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
