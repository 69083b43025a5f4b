#pragma once

// A base cost model corrected by coefficients fitted to measured iterations
// (planner/cost_model/cost_refit.h fits them). Per pass (forward, backward),
// the time of a model chunk for one micro-batch is
//   scale * base + token_ms * tokens + attention_ms * attention
//     + size_ms * size + micro_batch_ms
// where tokens and attention sum LayerFeatures over the chunk's layers. Per
// layer this is scale * base plus the token and attention terms of
// transformer layers; the per-micro-batch constant (and the measured dispatch
// and hand-off outside compute) is charged per chunk through Overheads().
// A pipeline factor scales all of a chunk's time.
// Memory is the base model's.

#include <memory>
#include <string>

#include "planner/cost_model/layer_cost.h"
#include "proto/cost_profile.pb.h"

namespace dynapipe::planner {

struct PassFit {
  double scale = 1;           // x the base model's time
  double token_ms = 0;        // per padded token per transformer layer
  double attention_ms = 0;    // per row x query length x key length per transformer layer
  double micro_batch_ms = 0;  // per micro-batch per chunk, inside the compute instruction
  // Per unit of LayerFeatures::size: what each token costs more as its
  // micro-batch grows (working sets past the caches on CPUs).
  double size_ms = 0;
  bool operator==(const PassFit&) const = default;
};

struct RefitTerms {
  PassFit fw, bw;
  // Measured per micro-batch per chunk outside compute (input loading,
  // receive posting, buffer frees).
  double dispatch_fw_ms = 0, dispatch_bw_ms = 0;
  // Per transfer; negative: not measured (the cluster's model applies).
  double transfer_latency_ms = -1, transfer_ms_per_mb = -1;
  // Per iteration beyond the pipeline; negative: not measured.
  double iteration_ms = -1;
  // Multiplies every chunk's time (compute and per-micro-batch terms): the
  // measured iteration over the simulated one.
  double pipeline_factor = 1;
  // Per micro-batch per chunk and pass, added like dispatch: what each
  // micro-batch costs an iteration beyond its instructions (hand-offs
  // between ranks that wait on each other): what each iteration's pipeline,
  // replayed with its passes as measured, leaves unexplained.
  double pipeline_mb_ms = 0;
};

// RefitTerms to and from a profile's MeasuredTerms (pp, dp and iterations
// left to the caller). `layout_matches` false keeps only the terms that do
// not depend on how ranks share a device: per micro-batch, per transfer and
// per iteration.
proto::MeasuredTerms ToProto(const RefitTerms& terms);
RefitTerms FromProto(const proto::MeasuredTerms& terms, bool layout_matches);

// What the token and attention terms count for one layer of `kind`.
struct LayerFeatures {
  double tokens = 0;
  double attention = 0;
  double size = 0;  // tokens squared x kSizeUnit: per-token cost growing with the micro-batch
};
inline constexpr double kSizeUnit = 1e-4;
LayerFeatures FeaturesOf(LayerKind kind, const Shape& shape);

class RefitCostModel : public LayerCostModel {
 public:
  RefitCostModel(std::shared_ptr<const LayerCostModel> base, const RefitTerms& terms)
      : base_(std::move(base)), terms_(terms) {}

  absl::StatusOr<LayerCost> Cost(LayerKind kind, const Shape& shape, Recompute r) const override;
  double ParamsMillions(LayerKind kind) const override { return base_->ParamsMillions(kind); }
  OverheadTerms Overheads() const override;
  std::string Describe() const override;
  bool MeasuredShape() const override { return base_->MeasuredShape(); }

  const RefitTerms& terms() const { return terms_; }
  const LayerCostModel& base() const { return *base_; }

 private:
  std::shared_ptr<const LayerCostModel> base_;
  RefitTerms terms_;
};

}  // namespace dynapipe::planner
