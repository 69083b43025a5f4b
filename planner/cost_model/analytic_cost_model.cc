#include "planner/cost_model/analytic_cost_model.h"

#include "absl/strings/str_cat.h"

namespace dynapipe::planner {
namespace {

double Or(double v, double d) { return v > 0 ? v : d; }

}  // namespace

absl::StatusOr<std::unique_ptr<AnalyticCostModel>> AnalyticCostModel::Create(
    const proto::ModelSpec& model, const proto::DeviceSpec& device, const proto::AnalyticCostOptions& options) {
  if (model.hidden() <= 0) return absl::InvalidArgumentError("model.hidden: must be positive");
  if (model.heads() <= 0) return absl::InvalidArgumentError("model.heads: must be positive");
  if (model.vocab() <= 0) return absl::InvalidArgumentError("model.vocab: must be positive");
  if (!(device.peak_tflops() > 0)) return absl::InvalidArgumentError("device.peak_tflops: must be positive");
  if (!(device.memory_bandwidth_gbps() > 0)) {
    return absl::InvalidArgumentError("device.memory_bandwidth_gbps: must be positive");
  }
  std::unique_ptr<AnalyticCostModel> m(new AnalyticCostModel());
  m->h_ = model.hidden();
  m->f_ = model.ffn() > 0 ? model.ffn() : 4.0 * model.hidden();
  m->a_ = model.heads();
  m->vocab_ = model.vocab();
  // Rotary positions (model.block.positions) have no learned table.
  m->positions_ = model.block().positions() == proto::PositionKind::rotary ? 0 : model.max_positions();
  m->causal_ = model.kind() != proto::ModelKind::t5;
  m->tied_ = model.tie_embeddings();
  // A gated feed-forward (model.block.mlp) has three ffn x hidden matrices, not two.
  m->gated_ = model.block().mlp() == proto::MlpKind::gated_gelu || model.block().mlp() == proto::MlpKind::swiglu;
  if (model.kv_heads() > 0) m->kv_frac_ = static_cast<double>(model.kv_heads()) / model.heads();
  m->device_name_ = device.name();
  m->peak_flops_ = device.peak_tflops() * 1e12;
  m->mem_bw_ = device.memory_bandwidth_gbps() * 1e9;
  m->gemm_eff_ = Or(options.gemm_efficiency(), 0.6);
  m->half_tokens_ = Or(options.half_efficiency_tokens(), 256);
  m->attn_eff_ = Or(options.attention_efficiency(), 0.4);
  m->mem_eff_ = Or(options.memory_efficiency(), 0.7);
  m->overhead_ms_ = options.layer_overhead_ms() > 0 ? options.layer_overhead_ms() : 0.03;
  // Unset: what the model's kernel does (varlen is FlashAttention's fused
  // kernel; materialized, or a model that names none, writes the scores).
  m->fused_ = options.attention() == proto::AnalyticCostOptions::unspecified
                  ? model.attention() == proto::AttentionKernel::varlen
                  : options.attention() == proto::AnalyticCostOptions::fused;
  m->bytes_ = options.bytes_per_element() > 0 ? options.bytes_per_element()
              : model.dtype() == proto::DType::fp32 ? 4
                                                    : 2;
  return m;
}

double AnalyticCostModel::GemmSeconds(double flops, double tokens) const {
  const double eff = gemm_eff_ * tokens / (tokens + half_tokens_);
  return flops / (peak_flops_ * eff);
}

double AnalyticCostModel::AttentionSeconds(double flops) const { return flops / (peak_flops_ * attn_eff_); }

double AnalyticCostModel::MemorySeconds(double bytes) const { return bytes / (mem_bw_ * mem_eff_); }

LayerCost AnalyticCostModel::Block(double tq, double tkv, double cells, bool causal, bool mlp, Recompute r) const {
  const double h = h_, f = f_, a = a_, B = bytes_;
  const double scale = B / 2;  // Korthikanti's byte counts assume 16-bit activations
  const bool self = tq == tkv;
  // GEMMs: Q and output projection on the query tokens, K and V (kv_frac_
  // of the heads) on the key tokens, MLP on the queries.
  const double proj_flops = 2 * tq * 2 * h * h + 2 * tkv * 2 * h * h * kv_frac_;
  const double mats = gated_ ? 3 : 2;  // ffn x hidden matrices in the MLP
  const double mlp_flops = mlp ? 2 * tq * mats * h * f : 0;
  const double causal_frac = causal && fused_ ? 0.5 : 1.0;  // fused kernels skip masked tiles
  const double attn_flops = 4 * cells * h * causal_frac;
  // Element-wise traffic: layer norms, residuals, dropout, GELU over 4h.
  const double elem_bytes = tq * (12 * h + (mlp ? (gated_ ? 6 : 4) * f : 0)) * B;
  const double score_bytes = fused_ ? 0 : 4 * a * cells * B;  // write, softmax r/w, read
  const double gemm_s = GemmSeconds(proj_flops + mlp_flops, tq);
  const double attn_s = AttentionSeconds(attn_flops) + MemorySeconds(score_bytes);
  const double elem_s = MemorySeconds(elem_bytes);

  LayerCost c;
  c.fw_ms = (gemm_s + attn_s + elem_s) * 1e3 + overhead_ms_;
  c.bw_ms = 2 * (gemm_s + attn_s + elem_s) * 1e3 + overhead_ms_;
  // Stored activations (bytes); the MLP accounts for 19 of Korthikanti's 34 sbh.
  // Gated: the up projection's output (8 sbh at f = 4h) is kept as well.
  const double mlp_sbh = mlp ? (gated_ ? 27.0 : 19.0) : 0.0;
  // Of the attention's 15 sbh, K and V make 4 (fewer with grouped-query heads).
  const double attn_sbh = 11.0 + 4.0 * kv_frac_;
  const double linear = (attn_sbh + mlp_sbh) * tq * h * scale + (self ? 0 : 2.0 * tkv * h * scale);
  const double scores = fused_ ? 0 : 5.0 * a * cells * scale;
  const double input = tq * h * B + (self ? 0 : tkv * h * B);
  const double transient = (fused_ ? 0 : 2.0 * a * cells * B) + (mlp ? tq * f * B : tq * h * B);
  double stored = linear + scores;
  double peak = transient;
  switch (r) {
    case Recompute::kNone: break;
    case Recompute::kSelective:
      stored = linear;
      c.bw_ms += attn_s * 1e3;
      break;
    case Recompute::kFull:
      stored = input;
      peak += linear + scores;  // rebuilt for the backward pass
      c.bw_ms += c.fw_ms;
      break;
  }
  c.stored_mb = stored / 1e6;
  c.peak_mb = peak / 1e6;
  return c;
}

absl::StatusOr<LayerCost> AnalyticCostModel::Cost(LayerKind kind, const Shape& shape, Recompute r) const {
  if (shape.mbs <= 0 || shape.seq <= 0) {
    return absl::OutOfRangeError(absl::StrCat("analytic cost: empty shape (mbs ", shape.mbs, ", seq ", shape.seq, ")"));
  }
  const double b = shape.mbs, s = shape.seq, sd = shape.dec_seq, h = h_, B = bytes_;
  switch (kind) {
    case LayerKind::kEncoder: return Block(b * s, b * s, shape.work_cells(), causal_, /*mlp=*/true, r);
    case LayerKind::kDecoder: {
      if (shape.dec_seq <= 0) return absl::OutOfRangeError("analytic cost: decoder layer needs dec_seq > 0");
      LayerCost self = Block(b * sd, b * sd, b * sd * sd, /*causal=*/true, /*mlp=*/true, r);
      const LayerCost cross = Block(b * sd, b * s, b * sd * s, /*causal=*/false, /*mlp=*/false, r);
      self.fw_ms += cross.fw_ms;
      self.bw_ms += cross.bw_ms;
      self.stored_mb += cross.stored_mb;
      self.peak_mb = std::max(self.peak_mb, cross.peak_mb);
      return self;
    }
    case LayerKind::kEmbedding: {
      const double tokens = b * (s + sd);
      LayerCost c;
      c.fw_ms = MemorySeconds(2 * tokens * h * B) * 1e3 + overhead_ms_;
      c.bw_ms = 2 * (c.fw_ms - overhead_ms_) + overhead_ms_;
      c.stored_mb = tokens * 8 / 1e6;  // token and position ids
      c.peak_mb = tokens * h * B / 1e6;
      return c;
    }
    case LayerKind::kPostprocess: {
      const double tokens = shape.head_tokens();  // the scored rows
      const double gemm_s = GemmSeconds(2 * tokens * h * vocab_, tokens);
      const double softmax_s = MemorySeconds(tokens * vocab_ * (B + 4) * 2);
      LayerCost c;
      c.fw_ms = (gemm_s + softmax_s + MemorySeconds(4 * tokens * h * B)) * 1e3 + overhead_ms_;
      c.bw_ms = (2 * gemm_s + softmax_s) * 1e3 + overhead_ms_;
      c.stored_mb = (tokens * h * B + tokens * vocab_ * 4) / 1e6;  // norm input, fp32 probabilities
      c.peak_mb = tokens * vocab_ * B / 1e6;
      return c;
    }
  }
  return absl::InternalError("unknown layer kind");
}

double AnalyticCostModel::ParamsMillions(LayerKind kind) const {
  const double h = h_, f = f_;
  switch (kind) {
    case LayerKind::kEncoder: return ((2 + 2 * kv_frac_) * h * h + (gated_ ? 3 : 2) * h * f + 9 * h + f) / 1e6;
    case LayerKind::kDecoder: return (8 * h * h + (gated_ ? 3 : 2) * h * f + 13 * h + f) / 1e6;
    case LayerKind::kEmbedding: return (vocab_ * h + positions_ * h) / 1e6;
    // Tied or not, the last stage holds an LM-head weight (a tied copy across stages).
    case LayerKind::kPostprocess: return (2 * h + vocab_ * h) / 1e6;
  }
  return 0;
}

std::string AnalyticCostModel::Describe() const {
  return absl::StrCat("analytic ", device_name_, fused_ ? " (fused attention)" : " (materialized attention)");
}

}  // namespace dynapipe::planner
