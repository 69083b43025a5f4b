#include "runtime/executor/hf_init.h"

#include "absl/strings/str_cat.h"
#include "runtime/model/hf_checkpoint.h"
#include "src/common/status_macros.h"
#include "src/safetensors/weight_set.h"

namespace dynapipe::runtime::executor {

namespace {

absl::Status Prefixed(const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("model.init_from: ", s.message()));
}

}  // namespace

absl::Status InitFromHuggingFace(const std::string& path, std::span<const std::unique_ptr<model::Stage>> chunks) {
  if (chunks.empty()) return absl::OkStatus();
  absl::StatusOr<safetensors::WeightSet> weights = safetensors::WeightSet::Open(path);
  if (!weights.ok()) return Prefixed(weights.status());
  // config.json beside the weights, where there is one: what no tensor's
  // shape shows (model type, heads; Llama's key-value heads, rope_theta,
  // rms_norm_eps) must be the job's.
  if (absl::Status s = model::CheckHfConfig(weights->config_json(), chunks.front()->config()); !s.ok()) {
    return Prefixed(s);
  }
  const model::HfSource source = model::WeightsSource(*weights);
  for (const auto& chunk : chunks) {
    model::StageState state;
    RETURN_IF_ERROR(chunk->ExportState(&state));
    if (absl::Status s = model::FromHuggingFace(chunk->layout(), source, state.params); !s.ok()) return Prefixed(s);
    std::fill(state.adam_m.begin(), state.adam_m.end(), 0.0f);
    std::fill(state.adam_v.begin(), state.adam_v.end(), 0.0f);
    RETURN_IF_ERROR(chunk->ImportState(state));
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::executor
