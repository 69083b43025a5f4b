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

}  // namespace dynapipe::planner
