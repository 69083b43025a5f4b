#pragma once

// Per-shape costs of a micro-batch through the whole pipeline, memoised: the
// partitioner, baselines and schedule search ask for the same shapes many
// times, within an iteration and across iterations of a job. Thread-safe.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "planner/cost_model/pipeline_model.h"
#include "src/common/mutex.h"

namespace dynapipe::planner {

struct ShapeCost {
  std::vector<ChunkCost> chunks;  // per chunk
  double time_ms = 0;             // slowest device's forward + backward for this micro-batch
  // Per device: stored activations and stored + transient peak of one
  // micro-batch on that device.
  std::vector<double> stored_mb, peak_mb;
  // Fits() answers, computed once: [0] one in flight, [1] the preferred budget.
  bool fits[2] = {false, false};
  // The LM head's share of the last chunk and that chunk's peak without it
  // (PipelineModel::ChunkCosts), to price the same grid with fewer scored
  // rows (ShapeCosts::Rescore).
  LayerCost head;
  double head_rest_peak = 0;
  // Summarize's figures without the last chunk, so that the same grid with
  // its head on fewer rows is summarized from that chunk alone
  // (ShapeCosts::RescoredTime), to the same bits: the slowest other
  // device's time, the last chunk's device's time, stored and peak over its
  // other chunks, and whether every other device fits ([0] one in flight,
  // [1] the preferred budget).
  struct Rest {
    double others_ms = 0, ms = 0, stored_mb = 0, peak_mb = 0;
    bool others_fit[2] = {true, true};
  } rest;
};

// What the partitioner's table needs of a shape: ShapeCost's time and fits.
struct ShapeTime {
  double time_ms = 0;
  bool fits[2] = {false, false};
};

class ShapeCosts {
 public:
  explicit ShapeCosts(std::shared_ptr<const PipelineModel> model) : model_(std::move(model)) {}

  // The cost of `shape` under recomputation `r`. Padded shapes whose head
  // scores the whole grid are computed once, then cached (the pointer does
  // not own them; they live as long as this object); shapes that compute
  // less than their grid (Shape::padded() false, or a head on fewer rows:
  // Shape::scored) differ for nearly every run of samples, so they are
  // computed on each call and owned by the pointer. OUT_OF_RANGE passes
  // through from the cost model.
  absl::StatusOr<std::shared_ptr<const ShapeCost>> Get(const Shape& shape, Recompute r);

  // Get's time_ms and fits without keeping the cost: for shapes that compute
  // less than their grid (nearly every varlen run of samples), this
  // allocates nothing, where Get builds and hands over a ShapeCost.
  // A varlen run of samples whose cost model is affine in the pairs is read
  // off its grid's line (CellsLine), computed on the grid's first query:
  // Get's time within 1e-12, its fits exactly.
  // Always the line, never the direct answer, for a grid that has one: the
  // two differ in the last bits, and a plan must not depend on what the
  // cache has seen (a restarted planner plans a resumed job's batches
  // alike).
  absl::StatusOr<ShapeTime> Time(const Shape& shape, Recompute r) {
    const int row = DenseRowIndex(shape, r);
    if (const ShapeCost* c = Cacheable(shape) ? dense_.Find(row, shape.mbs) : nullptr) {
      return ShapeTime{c->time_ms, {c->fits[0], c->fits[1]}};
    }
    if (OnLine(shape)) {
      const CellsLine* line = lines_.Find(row, shape.mbs);
      if (line == nullptr) line = AddLine(shape, r, row);
      if (line != nullptr && line->usable) return line->At(shape.cells);
    }
    return Uncached(shape, r);
  }

  // Get's per-chunk costs into `out` (num_chunks() entries) without
  // allocating: a cached grid's copied (its head priced again when the shape
  // scores fewer rows), any other shape's computed.
  absl::Status Chunks(const Shape& shape, Recompute r, std::span<ChunkCost> out);

  // Whether the cost of `shape` is kept once computed (padded shapes; one
  // that scores fewer rows is its grid's cost with the head priced again).
  static bool Cacheable(const Shape& s) { return s.padded() && s.scored == 0; }
  static bool Rescorable(const Shape& s) { return s.padded() && s.scored > 0; }

  // Whether one micro-batch of this cost fits on every device when each keeps
  // `in_flight(d)` such micro-batches: model state + in_flight * stored + the
  // transient peak of one, against the memory limit.
  bool Fits(const ShapeCost& c, bool preferred) const { return c.fits[preferred ? 1 : 0]; }

  const PipelineModel& model() const { return *model_; }

 private:
  // `grid`'s per-chunk costs (its head over every row) with the head
  // priced on shape.scored rows instead, into `chunks` (num_chunks()
  // entries); the head's cost into *head.
  absl::Status Rescore(const ShapeCost& grid, const Shape& shape, Recompute r, std::span<ChunkCost> chunks,
                       LayerCost* head) const;
  // Rescorable shapes: their time and fits without allocating.
  absl::StatusOr<ShapeTime> RescoredTime(const Shape& shape, Recompute r);
  // The cached cost of `shape`'s grid (its head over every row).
  absl::StatusOr<std::shared_ptr<const ShapeCost>> Grid(const Shape& shape, Recompute r) {
    Shape grid = shape;
    grid.scored = 0;
    return Get(grid, r);
  }
  // Per device from per-chunk costs: time (slowest device's forward +
  // backward), stored and peak megabytes, and the fits.
  // With `rest`, also the figures without the last chunk (ShapeCost::Rest);
  // with `device_ms` (num_devices() entries), each device's time.
  void Summarize(std::span<const ChunkCost> chunks, std::span<double> stored_mb, std::span<double> peak_mb,
                 double* time_ms, bool fits[2], ShapeCost::Rest* rest = nullptr,
                 std::span<double> device_ms = {}) const;
  // Whether device d fits model state + in-flight micro-batches of
  // `stored_mb` each + the transient `peak_mb` of one: one in flight, or the
  // preferred budget (1F1B keeps D - d micro-batches in flight on device d).
  bool FitsOn(int d, bool preferred, double stored_mb, double peak_mb) const {
    const PipelineModel& pm = *model_;
    const int in_flight = preferred ? pm.num_devices() - d : 1;
    return !(pm.StaticMb(d) + in_flight * stored_mb + peak_mb > pm.memory().limit_mb);
  }
  // Summarize over cost.chunks into the rest of `cost`.
  void SummarizeInto(ShapeCost& cost) const;
  absl::StatusOr<std::unique_ptr<ShapeCost>> Compute(const Shape& shape, Recompute r) const;
  // Time() past the lock-free rows.
  absl::StatusOr<ShapeTime> Uncached(const Shape& shape, Recompute r);
  // `shape`'s figures computed now from its per-chunk costs (Summarize's
  // outputs; nothing cached).
  absl::Status Direct(const Shape& shape, Recompute r, std::span<double> stored_mb, std::span<double> peak_mb,
                      double* time_ms, bool fits[2], std::span<double> device_ms = {}) const;
  // A pointer to a cached entry that does not own it.
  static std::shared_ptr<const ShapeCost> Borrowed(const ShapeCost* c) { return {std::shared_ptr<void>(), c}; }
  // Lock-free lookups for decoder-only grids: rows per (recompute, seq / 8),
  // each holding kDenseMbs atomic pointers, allocated on first use; the
  // entries are owned elsewhere and live as long as this object.
  static constexpr int kDenseSeqRows = 2048;  // seq up to 16384
  static constexpr int kDenseMbs = 1024;
  static int DenseRowIndex(const Shape& s, Recompute r) {
    if (s.dec_seq != 0 || s.seq % 8 != 0 || s.seq / 8 >= kDenseSeqRows || s.mbs >= kDenseMbs) return -1;
    return static_cast<int>(r) * kDenseSeqRows + s.seq / 8;
  }
  template <typename T>
  class DenseTable {
   public:
    // The entry, or null (none yet, or row < 0: not such a grid).
    const T* Find(int row, int mbs) const {
      if (row < 0) return nullptr;
      const Row* dense = rows_[row].load(std::memory_order_acquire);
      const Block* block = dense == nullptr ? nullptr : dense->block[mbs / kBlock].load(std::memory_order_acquire);
      return block == nullptr ? nullptr : block->slot[mbs % kBlock].load(std::memory_order_acquire);
    }
    // Under the owner's lock; row >= 0.
    void Put(int row, int mbs, const T* entry) {
      Row* dense = rows_[row].load(std::memory_order_relaxed);
      if (dense == nullptr) {
        dense = Own(owned_rows_);
        rows_[row].store(dense, std::memory_order_release);
      }
      Block* block = dense->block[mbs / kBlock].load(std::memory_order_relaxed);
      if (block == nullptr) {
        block = Own(owned_blocks_);
        dense->block[mbs / kBlock].store(block, std::memory_order_release);
      }
      block->slot[mbs % kBlock].store(entry, std::memory_order_release);
    }

   private:
    // Slots come in blocks of kBlock row counts, allocated as used: a
    // planner touches few row counts per length, and every page a fresh
    // table touches costs a fault (tens of microseconds on some VMs).
    static constexpr int kBlock = 32;
    struct Block {
      std::atomic<const T*> slot[kBlock];
    };
    struct Row {
      std::atomic<Block*> block[kDenseMbs / kBlock];
    };
    template <typename U>
    static U* Own(std::vector<std::unique_ptr<U>>& owned) {
      owned.push_back(std::make_unique<U>());  // atomics value-initialized: null
      return owned.back().get();
    }
    std::unique_ptr<std::atomic<Row*>[]> rows_ =
        std::make_unique<std::atomic<Row*>[]>(static_cast<size_t>(kNumRecompute) * kDenseSeqRows);
    std::vector<std::unique_ptr<Row>> owned_rows_;
    std::vector<std::unique_ptr<Block>> owned_blocks_;
  };

  // A decoder-only grid's costs as a function of the pairs attention
  // computes, for varlen runs of samples (cells > 0, the head on every row):
  // per device, the time at one cell and per further cell; and, memory
  // growing with the pairs, the most pairs that fit ([0] one in flight, [1]
  // the preferred budget; 0: none). Not usable when the cost model is not
  // affine in cells, the grid's midpoint is off the line, a memory figure
  // fell as pairs grew, or a point had no cost (such shapes are computed).
  struct CellsLine {
    bool usable = false;
    absl::InlinedVector<double, 16> at_one, per_cell;
    int64_t most_fitting[2] = {0, 0};
    ShapeTime At(int64_t cells) const {
      ShapeTime t{0, {cells <= most_fitting[0], cells <= most_fitting[1]}};
      for (size_t d = 0; d < at_one.size(); ++d) {
        t.time_ms = std::max(t.time_ms, at_one[d] + static_cast<double>(cells - 1) * per_cell[d]);
      }
      return t;
    }
  };
  static bool OnLine(const Shape& s) { return s.cells > 0 && s.scored == 0 && s.dec_seq == 0; }
  // Computes `shape`'s grid's line and keeps it at dense row `row` (a
  // racing thread's, the same, if it came first); null when the grid has no
  // dense slot (row < 0).
  const CellsLine* AddLine(const Shape& shape, Recompute r, int row);
  std::unique_ptr<CellsLine> MakeLine(const Shape& shape, Recompute r) const;

  static uint64_t Key(const Shape& s, Recompute r) {
    return (static_cast<uint64_t>(s.mbs) << 40) ^ (static_cast<uint64_t>(s.seq) << 20) ^
           static_cast<uint64_t>(s.dec_seq) ^ (static_cast<uint64_t>(r) << 62);
  }

  std::shared_ptr<const PipelineModel> model_;
  Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<ShapeCost>> cache_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  DenseTable<ShapeCost> dense_;  // cache_'s grids, written under mu_
  std::vector<std::unique_ptr<CellsLine>> line_store_ ABSL_GUARDED_BY(mu_);
  DenseTable<CellsLine> lines_;  // line_store_'s lines, written under mu_
};

}  // namespace dynapipe::planner
