#pragma once

// Cost model from model dimensions and a device description, so planning works
// before any profile exists. Times: GEMM FLOPs at a size-dependent fraction of
// peak, attention quadratic in length, element-wise work bounded by memory
// bandwidth, a fixed per-layer launch cost. Memory: activation sizes of
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"): 34*s*b*h + 5*a*s^2*b bytes per layer in 16-bit with
// scores materialised, 34*s*b*h with selective recomputation (or a fused
// kernel), 2*s*b*h (the layer input) with full recomputation.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "planner/cost_model/layer_cost.h"
#include "proto/cluster.pb.h"
#include "proto/cost_profile.pb.h"
#include "proto/model.pb.h"

namespace dynapipe::planner {

class AnalyticCostModel : public LayerCostModel {
 public:
  // INVALID_ARGUMENT names a missing or non-positive dimension or device figure.
  static absl::StatusOr<std::unique_ptr<AnalyticCostModel>> Create(const proto::ModelSpec& model,
                                                                   const proto::DeviceSpec& device,
                                                                   const proto::AnalyticCostOptions& options);

  absl::StatusOr<LayerCost> Cost(LayerKind kind, const Shape& shape, Recompute r) const override;
  double ParamsMillions(LayerKind kind) const override;
  std::string Describe() const override;
  // Attention's flops and score bytes are linear in the pairs; nothing else
  // depends on them.
  bool AffineInCells() const override { return true; }

 private:
  AnalyticCostModel() = default;
  // Seconds for `flops` of GEMM work spread over `tokens` rows.
  double GemmSeconds(double flops, double tokens) const;
  double AttentionSeconds(double flops) const;
  double MemorySeconds(double bytes) const;
  // One self- or cross-attention block plus (optionally) the MLP.
  // One attention block over `tq` query tokens and `tkv` key tokens with
  // `cells` query x key pairs (b * sq * skv for a padded grid).
  LayerCost Block(double tq, double tkv, double cells, bool causal, bool mlp, Recompute r) const;

  double h_ = 0, f_ = 0, a_ = 0, vocab_ = 0, positions_ = 0;
  bool causal_ = true;  // GPT: causal self-attention; T5 encoder: bidirectional
  bool tied_ = true;
  bool gated_ = false;  // gated feed-forward: three matrices
  // Key-value heads per query head (grouped-query attention shrinks the K
  // and V projections and what they keep); 1 for multi-head attention.
  double kv_frac_ = 1;
  std::string device_name_;
  double peak_flops_ = 0, mem_bw_ = 0;  // per second
  double gemm_eff_ = 0, half_tokens_ = 0, attn_eff_ = 0, mem_eff_ = 0, overhead_ms_ = 0;
  bool fused_ = false;
  double bytes_ = 2;
};

}  // namespace dynapipe::planner
