#include "runtime/executor/hf_init.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/model/hf_checkpoint.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "src/safetensors/weight_set.h"

namespace dynapipe::runtime::executor {

namespace {

absl::Status Prefixed(const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("model.init_from: ", s.message()));
}

// config.json beside the weights, where there is one: the same kind of model
// and number of heads (which no tensor's shape shows).
absl::Status CheckConfig(const std::string& json, const model::GptConfig& c) {
  if (json.empty()) return absl::OkStatus();
  google::protobuf::Struct config;
  RETURN_IF_ERROR(ParseJsonProto(json, "config.json", &config));
  const auto& f = config.fields();
  const std::string want = c.encoder_decoder ? "t5" : "gpt2";
  if (auto it = f.find("model_type"); it != f.end() && it->second.string_value() != want) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: model_type \"", it->second.string_value(),
                                                   "\"; the job's model needs \"", want, "\""));
  }
  const char* heads = c.encoder_decoder ? "num_heads" : "n_head";
  if (auto it = f.find(heads); it != f.end() && it->second.number_value() != c.heads) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", heads, " ", it->second.number_value(),
                                                   "; the job's model.heads is ", c.heads));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InitFromHuggingFace(const std::string& path, std::span<const std::unique_ptr<model::Stage>> chunks) {
  if (chunks.empty()) return absl::OkStatus();
  absl::StatusOr<safetensors::WeightSet> weights = safetensors::WeightSet::Open(path);
  if (!weights.ok()) return Prefixed(weights.status());
  if (absl::Status s = CheckConfig(weights->config_json(), chunks.front()->config()); !s.ok()) return Prefixed(s);
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
