#include "planner/cost_model/layer_cost.h"

namespace dynapipe::planner {

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kEmbedding: return "embedding";
    case LayerKind::kEncoder: return "encoder";
    case LayerKind::kDecoder: return "decoder";
    case LayerKind::kPostprocess: return "postprocess";
  }
  return "?";
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

Shape WorkShape(Shape padded, int64_t sum_sq, const WorkModel& work) {
  padded.cells = 0;
  if (padded.dec_seq > 0 || !work.varlen_attention) return padded;
  const int64_t grid_cells = static_cast<int64_t>(padded.mbs) * padded.seq * padded.seq;
  if (sum_sq != grid_cells) padded.cells = sum_sq;
  return padded;
}

}  // namespace dynapipe::planner
