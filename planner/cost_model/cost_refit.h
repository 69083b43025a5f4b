#pragma once

// Learns a job's costs from its measured iterations. Each executed iteration
// (every rank's plan joined with its instruction timings) becomes samples:
// the forward and backward instructions of each model chunk with their
// micro-batch's shape and the base model's prediction, the sends with their
// bytes, the per-micro-batch dispatch outside compute, and the per-iteration
// work after the pipeline (all-reduce, optimizer step). CostRefit fits
// RefitTerms (refit_cost_model.h) over a sliding window of iterations:
// non-negative least squares per pass, iterations whose speed is far from
// the window's median left out, medians for the scalar terms, and a bounded
// change per refit, so one noisy iteration cannot derail it. Where the base
// model's shape was measured on the machine (a cost profile:
// LayerCostModel::MeasuredShape), the pass fit keeps that shape and learns
// only its scale and a cost per micro-batch, pulled toward the previous fit
// where the window cannot tell the two apart: a window of micro-batches of
// one size cannot show how cost grows with size, and a fit of every term
// over such a window forgets it. Last, what per-instruction times do not
// show (hand-offs between ranks that wait on each other, threads sharing
// cores) becomes a cost per pass: the one that makes each pipeline,
// replayed with its passes as measured, last as long as it did (the median
// over the window); and a pipeline factor (the median of measured over
// simulated under the fitted costs) takes in what the fitted passes miss.
// Until `min_iterations` iterations are in, the base model answers. Pure
// and single-threaded (callers lock).

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model/pipeline_model.h"
#include "planner/cost_model/refit_cost_model.h"
#include "planner/sim/simulator.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"

namespace dynapipe::planner {

// One forward or backward of one chunk for one micro-batch.
struct ComputeSample {
  bool backward = false;
  double base_ms = 0;  // the base model's layers, no overheads
  double tokens = 0, attention = 0, size = 0;  // LayerFeatures summed over the chunk
  double measured_ms = 0;
};

struct TransferSample {
  double mb = 0;  // megabytes sent
  double measured_ms = 0;  // start + finish on the sender
};

// One data-parallel group's pipeline as executed, to simulate it again under
// other costs: per (micro-batch, chunk) at [mb * chunks + chunk] the chunk's
// base costs and features, and each device's order of forwards and backwards.
struct ReplayGroup {
  int num_mb = 0;
  std::vector<ComputeSample> fw, bw;  // measured_ms: the pass as timed (0: not timed)
  std::vector<double> boundary_mb;    // activations sent from chunk c to c + 1
  DeviceOrders orders;
};

struct IterationSamples {
  int64_t iteration = 0;
  double measured_ms = 0;   // slowest rank
  double predicted_ms = 0;  // the plan's
  std::vector<ComputeSample> compute;
  std::vector<TransferSample> transfers;
  // Dispatch outside compute, summed over ranks, and the (micro-batch,
  // chunk) pairs it was spread over.
  double dispatch_fw_ms = 0, dispatch_bw_ms = 0;
  int units = 0;
  double iteration_ms = 0;  // after the pipeline: the least any rank spent (the others waited for it)
  std::vector<ReplayGroup> groups;
  std::vector<int> chunk_device;  // chunk -> pipeline device
  int num_devices = 0;
};

// Joins one iteration's plans (index = global rank) and reports (any order,
// one per rank) into samples; `layout` gives the chunks, `base` the base
// costs. INVALID_ARGUMENT when they do not match.
absl::StatusOr<IterationSamples> SamplesOf(const PipelineModel& layout, const LayerCostModel& base,
                                           std::span<const proto::ExecutionPlan> plans,
                                           std::span<const proto::IterationReport> reports);

struct RefitOptions {
  int window = 8;          // iterations fitted
  int min_iterations = 3;  // before this many, the base model answers
  double max_step = 2.0;   // one refit changes the window's predicted compute by at most this factor
  double outlier = 0.3;    // iterations whose speed is off the median by more than this are left out
  double ridge = 1e-6;     // pull toward the base model's shape where the data cannot tell (scaled problem)
};

class CostRefit {
 public:
  CostRefit(std::shared_ptr<const LayerCostModel> base, RefitOptions options = {});

  // Adds an iteration's samples and refits (once min_iterations are in).
  void Add(IterationSamples samples);

  bool fitted() const { return fitted_; }
  int refits() const { return refits_; }
  const RefitTerms& terms() const { return terms_; }
  // The base model until fitted, then the base corrected by terms().
  std::shared_ptr<const LayerCostModel> model() const { return model_; }
  // Iterations the last refit left out as outliers.
  int outliers() const { return outliers_; }
  // The current terms with a larger cost per micro-batch, to plan a few
  // iterations with (fewer, larger micro-batches) so that the fit sees
  // larger micro-batches than the plans settle on; with
  // `smaller`, a larger size term instead (more, smaller micro-batches), so
  // that what a token costs in a small micro-batch is seen as well.
  RefitTerms ExplorationTerms(bool smaller = false) const;

  // What `terms` predict for an iteration's compute and dispatch (ms, summed).
  static double PredictCompute(const RefitTerms& terms, const IterationSamples& s);
  // The iteration's time under `terms`: its pipelines simulated again, the
  // slowest group, plus the time after the pipeline. -1 if it cannot be
  // simulated (no replay).
  static double PredictIteration(const RefitTerms& terms, const IterationSamples& s);

 private:
  void Refit();

  std::shared_ptr<const LayerCostModel> base_;
  RefitOptions options_;
  std::deque<IterationSamples> window_;
  double chunk_ms_ = 0;  // median chunk pass under the last fit
  double pass_per_size_ = 0;  // median of a chunk pass over its size feature
  RefitTerms terms_;
  bool fitted_ = false;
  int refits_ = 0;
  int outliers_ = 0;
  std::shared_ptr<const LayerCostModel> model_;
};

}  // namespace dynapipe::planner
