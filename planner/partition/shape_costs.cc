#include "planner/partition/shape_costs.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner {

void ShapeCosts::Summarize(std::span<const ChunkCost> chunks, std::span<double> stored_mb, std::span<double> peak_mb,
                           double* time_ms, bool fits[2], ShapeCost::Rest* rest,
                           std::span<double> device_ms) const {
  const PipelineModel& pm = *model_;
  const int D = pm.num_devices(), C = pm.num_chunks();
  absl::InlinedVector<double, 16> time(D, 0);
  std::fill(stored_mb.begin(), stored_mb.end(), 0.0);
  std::fill(peak_mb.begin(), peak_mb.end(), 0.0);
  for (int c = 0; c < C; ++c) {
    const int d = pm.chunks()[c].device;
    const ChunkCost& cc = chunks[c];
    if (rest != nullptr && c == C - 1) {
      rest->ms = time[d];
      rest->stored_mb = stored_mb[d];
      rest->peak_mb = peak_mb[d];
    }
    time[d] += cc.fw_ms + cc.bw_ms;
    stored_mb[d] += cc.stored_mb;
    peak_mb[d] = std::max(peak_mb[d], cc.peak_mb);
  }
  *time_ms = *std::max_element(time.begin(), time.end());
  std::copy_n(time.begin(), std::min(device_ms.size(), time.size()), device_ms.begin());
  for (const bool preferred : {false, true}) {
    bool fit = true;
    for (int d = 0; d < D && fit; ++d) fit = FitsOn(d, preferred, stored_mb[d], peak_mb[d]);
    fits[preferred ? 1 : 0] = fit;
  }
  if (rest == nullptr) return;
  const int last = pm.chunks()[C - 1].device;
  rest->others_ms = 0;
  for (const bool preferred : {false, true}) {
    bool fit = true;
    for (int d = 0; d < D; ++d) {
      if (d != last) fit = fit && FitsOn(d, preferred, stored_mb[d], peak_mb[d]);
    }
    rest->others_fit[preferred ? 1 : 0] = fit;
  }
  for (int d = 0; d < D; ++d) {
    if (d != last) rest->others_ms = std::max(rest->others_ms, time[d]);
  }
}

absl::StatusOr<std::unique_ptr<ShapeCost>> ShapeCosts::Compute(const Shape& shape, Recompute r) const {
  const PipelineModel& pm = *model_;
  auto cost = std::make_unique<ShapeCost>();
  cost->chunks.resize(pm.num_chunks());
  RETURN_IF_ERROR(pm.ChunkCosts(shape, r, std::span<ChunkCost>(cost->chunks), &cost->head, &cost->head_rest_peak));
  SummarizeInto(*cost);
  return cost;
}

void ShapeCosts::SummarizeInto(ShapeCost& cost) const {
  cost.stored_mb.assign(model_->num_devices(), 0);
  cost.peak_mb.assign(model_->num_devices(), 0);
  Summarize(cost.chunks, cost.stored_mb, cost.peak_mb, &cost.time_ms, cost.fits, &cost.rest);
}

absl::Status ShapeCosts::Rescore(const ShapeCost& grid, const Shape& shape, Recompute r, std::span<ChunkCost> chunks,
                                 LayerCost* head) const {
  const PipelineModel& pm = *model_;
  ASSIGN_OR_RETURN(*head, pm.cost_model().Cost(LayerKind::kPostprocess, shape, r));
  std::copy(grid.chunks.begin(), grid.chunks.end(), chunks.begin());
  if (pm.chunks().back().postprocess) {
    ChunkCost& last = chunks.back();
    last.fw_ms += head->fw_ms - grid.head.fw_ms;
    last.bw_ms += head->bw_ms - grid.head.bw_ms;
    last.stored_mb += head->stored_mb - grid.head.stored_mb;
    last.peak_mb = std::max(grid.head_rest_peak, head->peak_mb);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShapeTime> ShapeCosts::RescoredTime(const Shape& shape, Recompute r) {
  ASSIGN_OR_RETURN(std::shared_ptr<const ShapeCost> grid, Grid(shape, r));
  const PipelineModel& pm = *model_;
  ASSIGN_OR_RETURN(const LayerCost head, pm.cost_model().Cost(LayerKind::kPostprocess, shape, r));
  if (!pm.chunks().back().postprocess) return ShapeTime{grid->time_ms, {grid->fits[0], grid->fits[1]}};
  // The last chunk as Rescore prices it, then Summarize's sums from there.
  const ChunkCost& was = grid->chunks.back();
  const ShapeCost::Rest& rest = grid->rest;
  const double fw = was.fw_ms + (head.fw_ms - grid->head.fw_ms);
  const double bw = was.bw_ms + (head.bw_ms - grid->head.bw_ms);
  const double stored = was.stored_mb + (head.stored_mb - grid->head.stored_mb);
  const double peak = std::max(grid->head_rest_peak, head.peak_mb);
  ShapeTime t;
  t.time_ms = std::max(rest.others_ms, rest.ms + (fw + bw));
  const int last = pm.chunks().back().device;
  for (const bool preferred : {false, true}) {
    t.fits[preferred ? 1 : 0] = rest.others_fit[preferred ? 1 : 0] &&
                                FitsOn(last, preferred, rest.stored_mb + stored, std::max(rest.peak_mb, peak));
  }
  return t;
}

absl::StatusOr<ShapeTime> ShapeCosts::Uncached(const Shape& shape, Recompute r) {
  if (Rescorable(shape)) return RescoredTime(shape, r);
  ShapeTime t;
  if (Cacheable(shape)) {
    ASSIGN_OR_RETURN(std::shared_ptr<const ShapeCost> c, Get(shape, r));
    t.time_ms = c->time_ms;
    t.fits[0] = c->fits[0];
    t.fits[1] = c->fits[1];
    return t;
  }
  absl::InlinedVector<double, 16> stored(model_->num_devices()), peak(model_->num_devices());
  RETURN_IF_ERROR(Direct(shape, r, std::span<double>(stored.data(), stored.size()),
                         std::span<double>(peak.data(), peak.size()), &t.time_ms, t.fits));
  return t;
}

absl::Status ShapeCosts::Direct(const Shape& shape, Recompute r, std::span<double> stored_mb,
                                std::span<double> peak_mb, double* time_ms, bool fits[2],
                                std::span<double> device_ms) const {
  const PipelineModel& pm = *model_;
  absl::InlinedVector<ChunkCost, 16> chunks(pm.num_chunks());
  RETURN_IF_ERROR(pm.ChunkCosts(shape, r, std::span<ChunkCost>(chunks.data(), chunks.size())));
  Summarize(std::span<const ChunkCost>(chunks.data(), chunks.size()), stored_mb, peak_mb, time_ms, fits, nullptr,
            device_ms);
  return absl::OkStatus();
}

absl::Status ShapeCosts::Chunks(const Shape& shape, Recompute r, std::span<ChunkCost> out) {
  if (Rescorable(shape)) {
    ASSIGN_OR_RETURN(std::shared_ptr<const ShapeCost> grid, Grid(shape, r));
    LayerCost head;
    return Rescore(*grid, shape, r, out, &head);
  }
  if (Cacheable(shape)) {
    ASSIGN_OR_RETURN(std::shared_ptr<const ShapeCost> c, Get(shape, r));
    std::copy(c->chunks.begin(), c->chunks.end(), out.begin());
    return absl::OkStatus();
  }
  return model_->ChunkCosts(shape, r, out);
}

absl::StatusOr<std::shared_ptr<const ShapeCost>> ShapeCosts::Get(const Shape& shape, Recompute r) {
  if (Rescorable(shape)) {
    ASSIGN_OR_RETURN(std::shared_ptr<const ShapeCost> grid, Grid(shape, r));
    auto cost = std::make_shared<ShapeCost>();
    cost->chunks.resize(grid->chunks.size());
    RETURN_IF_ERROR(Rescore(*grid, shape, r, std::span<ChunkCost>(cost->chunks), &cost->head));
    cost->head_rest_peak = grid->head_rest_peak;
    SummarizeInto(*cost);
    return std::shared_ptr<const ShapeCost>(std::move(cost));
  }
  if (!Cacheable(shape)) {
    ASSIGN_OR_RETURN(std::unique_ptr<ShapeCost> cost, Compute(shape, r));
    return std::shared_ptr<const ShapeCost>(std::move(cost));
  }
  const int row = DenseRowIndex(shape, r);
  if (const ShapeCost* c = dense_.Find(row, shape.mbs)) return Borrowed(c);
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
  if (row >= 0) dense_.Put(row, shape.mbs, result);
  return Borrowed(result);
}

std::unique_ptr<ShapeCosts::CellsLine> ShapeCosts::MakeLine(const Shape& shape, Recompute r) const {
  auto line = std::make_unique<CellsLine>();
  const PipelineModel& pm = *model_;
  const int64_t grid = static_cast<int64_t>(shape.mbs) * shape.seq * shape.seq;
  if (!pm.cost_model().AffineInCells() || grid < 3) return line;
  const int D = pm.num_devices();
  // Each device's time, stored and peak megabytes at `cells` pairs.
  struct Point {
    absl::InlinedVector<double, 16> time, stored, peak;
    bool fits[2] = {false, false};
  };
  const auto at = [&](int64_t cells) -> std::optional<Point> {
    Shape s = shape;
    s.cells = cells;
    Point p;
    p.time.resize(D);
    p.stored.resize(D);
    p.peak.resize(D);
    double slowest = 0;
    if (!Direct(s, r, std::span<double>(p.stored.data(), D), std::span<double>(p.peak.data(), D), &slowest, p.fits,
                std::span<double>(p.time.data(), D))
             .ok()) {
      return std::nullopt;
    }
    return p;
  };
  const int64_t half = grid / 2;
  const std::optional<Point> one = at(1), mid = at(half), whole = at(grid);
  if (!one || !mid || !whole) return line;
  line->at_one = one->time;
  line->per_cell.resize(D);
  for (int d = 0; d < D; ++d) {
    line->per_cell[d] = (whole->time[d] - one->time[d]) / static_cast<double>(grid - 1);
    const double on_line = one->time[d] + static_cast<double>(half - 1) * line->per_cell[d];
    if (std::abs(on_line - mid->time[d]) > 1e-9 * std::max(1.0, std::abs(mid->time[d]))) return line;
    if (one->stored[d] > mid->stored[d] || mid->stored[d] > whole->stored[d] || one->peak[d] > mid->peak[d] ||
        mid->peak[d] > whole->peak[d]) {
      return line;
    }
  }
  // Memory only grows with the pairs: the fitting ones are those up to a
  // threshold, found by bisection where the grid's ends disagree.
  for (const int p : {0, 1}) {
    if (whole->fits[p] || !one->fits[p]) {
      line->most_fitting[p] = whole->fits[p] ? grid : 0;
      continue;
    }
    int64_t fits = 1, fails = grid;
    while (fails - fits > 1) {
      const int64_t m = fits + (fails - fits) / 2;
      const std::optional<Point> at_m = at(m);
      if (!at_m) return line;
      (at_m->fits[p] ? fits : fails) = m;
    }
    line->most_fitting[p] = fits;
  }
  line->usable = true;
  return line;
}

const ShapeCosts::CellsLine* ShapeCosts::AddLine(const Shape& shape, Recompute r, int row) {
  if (row < 0) return nullptr;
  std::unique_ptr<CellsLine> line = MakeLine(shape, r);
  MutexLock lock(&mu_);
  if (const CellsLine* other = lines_.Find(row, shape.mbs)) return other;  // another thread's
  line_store_.push_back(std::move(line));
  lines_.Put(row, shape.mbs, line_store_.back().get());
  return line_store_.back().get();
}

}  // namespace dynapipe::planner
