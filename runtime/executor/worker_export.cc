// Worker::ExportHuggingFace: the job's trained model in Hugging Face's
// format at its end (export_dir).

#include <filesystem>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/executor/worker.h"
#include "runtime/model/hf_checkpoint.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

namespace {

// Shards of at most this many bytes (transformers' own default).
constexpr uint64_t kExportShardBytes = uint64_t{5000} << 20;

// Whether this stage gives tensor `name` to the whole model: a tensor
// several stages hold (all of them alike) comes from one of them only, so
// the pipeline's sum is its value.
bool Gives(const std::string& name, const model::StageOptions& o, const model::GptConfig& c) {
  if (name == "wte") return o.first;
  if (name == "enc.rel_bias") return o.first_layer == 0;
  if (name == "dec.rel_bias") return o.first_layer <= c.num_layers && c.num_layers < o.first_layer + o.num_layers;
  return true;
}

}  // namespace

absl::Status Worker::ExportHuggingFace(const std::string& dir) {
  if (rank_ / pp_ != 0 || chunks_.empty()) return absl::OkStatus();  // data-parallel group 0 holds the model
  const model::GptConfig& c = chunks_.front()->config();
  ASSIGN_OR_RETURN(const model::GptLayout whole,
                   model::GptLayout::Make(c, {0, c.TotalLayers(), true, true, spec_.seed()}));
  ASSIGN_OR_RETURN(const std::string config_json, model::HfConfigJson(c));
  std::vector<float> params(whole.num_params(), 0.0f);
  for (const auto& chunk : chunks_) {
    model::StageState st;
    RETURN_IF_ERROR(chunk->ExportState(&st));
    for (const model::ParamInfo& p : chunk->layout().params()) {
      if (!Gives(p.name, chunk->options(), c)) continue;
      const model::ParamInfo* w = whole.FindParam(p.name);
      if (w == nullptr || w->size != p.size) return absl::InternalError(absl::StrCat("export: tensor ", p.name));
      std::copy(st.params.begin() + p.offset, st.params.begin() + p.offset + p.size, params.begin() + w->offset);
    }
  }
  if (pp_ > 1) {  // every stage's tensors, through the backend's memory (NCCL reduces device buffers)
    std::vector<int> group(pp_);
    std::iota(group.begin(), group.end(), 0);
    const size_t bytes = params.size() * sizeof(float);
    ASSIGN_OR_RETURN(Buffer buf, backend_->pool().Get(bytes, backend_->stream()));
    RETURN_IF_ERROR(backend_->CopyFromHost(buf.data(), params.data(), bytes));
    RETURN_IF_ERROR(comm_->AllReduceSum(group, buf.as<float>(), params.size(), Deadline()));
    RETURN_IF_ERROR(backend_->CopyToHost(params.data(), buf.data(), bytes));
  }
  if (rank_ != 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<model::HfTensor> tensors, model::ToHuggingFace(whole, params));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("export_dir ", dir, ": ", ec.message()));
  return Annotate(model::WriteHfModel(tensors, config_json, dir, kExportShardBytes, nullptr), "export_dir");
}

}  // namespace dynapipe::runtime::executor
