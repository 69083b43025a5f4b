#include "planner/cost_model/refit_cost_model.h"

#include "absl/strings/str_format.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner {

LayerFeatures FeaturesOf(LayerKind kind, const Shape& shape) {
  const double b = shape.mbs, s = shape.seq, sd = shape.dec_seq;
  switch (kind) {
    case LayerKind::kEncoder: return {b * s, shape.work_cells(), b * s * b * s * kSizeUnit};
    // Self-attention over the decoder length plus cross-attention to the encoder.
    case LayerKind::kDecoder: return {b * sd, b * sd * (sd + s), b * sd * b * sd * kSizeUnit};
    case LayerKind::kEmbedding:
    case LayerKind::kPostprocess: break;
  }
  return {};
}

namespace {

proto::PassTerms PassToProto(const PassFit& p) {
  proto::PassTerms t;
  t.set_scale(p.scale);
  t.set_token_ms(p.token_ms);
  t.set_attention_ms(p.attention_ms);
  t.set_micro_batch_ms(p.micro_batch_ms);
  t.set_size_ms(p.size_ms);
  return t;
}

PassFit PassFromProto(const proto::PassTerms& t, bool layout_matches) {
  if (!layout_matches) return PassFit{.micro_batch_ms = t.micro_batch_ms()};
  return PassFit{t.scale(), t.token_ms(), t.attention_ms(), t.micro_batch_ms(), t.size_ms()};
}

}  // namespace

proto::MeasuredTerms ToProto(const RefitTerms& terms) {
  proto::MeasuredTerms t;
  *t.mutable_fw() = PassToProto(terms.fw);
  *t.mutable_bw() = PassToProto(terms.bw);
  t.set_dispatch_fw_ms(terms.dispatch_fw_ms);
  t.set_dispatch_bw_ms(terms.dispatch_bw_ms);
  if (terms.transfer_latency_ms >= 0 && terms.transfer_ms_per_mb >= 0) {
    t.set_transfer_latency_ms(terms.transfer_latency_ms);
    t.set_transfer_ms_per_mb(terms.transfer_ms_per_mb);
  }
  if (terms.iteration_ms >= 0) t.set_iteration_ms(terms.iteration_ms);
  t.set_pipeline_factor(terms.pipeline_factor);
  t.set_pipeline_mb_ms(terms.pipeline_mb_ms);
  return t;
}

RefitTerms FromProto(const proto::MeasuredTerms& t, bool layout_matches) {
  RefitTerms terms;
  // A profile written before these terms existed has scale 0: the layers as profiled.
  terms.fw = t.has_fw() ? PassFromProto(t.fw(), layout_matches) : PassFit{};
  terms.bw = t.has_bw() ? PassFromProto(t.bw(), layout_matches) : PassFit{};
  terms.dispatch_fw_ms = t.dispatch_fw_ms();
  terms.dispatch_bw_ms = t.dispatch_bw_ms();
  if (t.has_transfer_latency_ms() && t.has_transfer_ms_per_mb()) {
    terms.transfer_latency_ms = t.transfer_latency_ms();
    terms.transfer_ms_per_mb = t.transfer_ms_per_mb();
  }
  if (t.has_iteration_ms()) terms.iteration_ms = t.iteration_ms();
  if (layout_matches && t.pipeline_factor() > 0) terms.pipeline_factor = t.pipeline_factor();
  if (layout_matches) terms.pipeline_mb_ms = t.pipeline_mb_ms();
  return terms;
}

absl::StatusOr<LayerCost> RefitCostModel::Cost(LayerKind kind, const Shape& shape, Recompute r) const {
  ASSIGN_OR_RETURN(LayerCost c, base_->Cost(kind, shape, r));
  const LayerFeatures f = FeaturesOf(kind, shape);
  const PassFit& fw = terms_.fw;
  const PassFit& bw = terms_.bw;
  const double fw_extra = fw.token_ms * f.tokens + fw.attention_ms * f.attention + fw.size_ms * f.size;
  const double k = terms_.pipeline_factor;
  c.fw_ms = k * (fw.scale * c.fw_ms + fw_extra);
  // The base backward of kFull already includes its recomputed forward; the
  // fitted terms were measured under the plan's own recomputation level.
  c.bw_ms = k * (bw.scale * c.bw_ms + bw.token_ms * f.tokens + bw.attention_ms * f.attention + bw.size_ms * f.size);
  return c;
}

OverheadTerms RefitCostModel::Overheads() const {
  OverheadTerms o;
  o.micro_batch_fw_ms =
      terms_.pipeline_factor * (terms_.fw.micro_batch_ms + terms_.dispatch_fw_ms + terms_.pipeline_mb_ms);
  o.micro_batch_bw_ms =
      terms_.pipeline_factor * (terms_.bw.micro_batch_ms + terms_.dispatch_bw_ms + terms_.pipeline_mb_ms);
  o.transfer_latency_ms = terms_.transfer_latency_ms;
  o.transfer_ms_per_mb = terms_.transfer_ms_per_mb;
  o.iteration_ms = terms_.iteration_ms;
  return o;
}

namespace {

// A pass's terms beyond the scale and the per-micro-batch constant, per
// transformer layer: ms per thousand tokens, per million attention pairs,
// and per thousand tokens at 1,000 tokens from the size term.
std::string PassShape(const PassFit& p) {
  return absl::StrFormat("%.3g ms/ktok, %.3g ms/Mpair, size %.3g", p.token_ms * 1e3, p.attention_ms * 1e6,
                         p.size_ms * 1e6 * kSizeUnit);
}

}  // namespace

std::string RefitCostModel::Describe() const {
  return absl::StrFormat(
      "%s, refit (fw x%.2f +%.2f ms/mb, bw x%.2f +%.2f ms/mb, pipeline x%.2f +%.2f ms/mb; fw %s; bw %s)",
      base_->Describe(), terms_.fw.scale, terms_.fw.micro_batch_ms + terms_.dispatch_fw_ms, terms_.bw.scale,
      terms_.bw.micro_batch_ms + terms_.dispatch_bw_ms, terms_.pipeline_factor, terms_.pipeline_mb_ms,
      PassShape(terms_.fw), PassShape(terms_.bw));
}

}  // namespace dynapipe::planner
