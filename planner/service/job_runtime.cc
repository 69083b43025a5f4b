#include "planner/service/job_runtime.h"

#include "absl/strings/str_cat.h"
#include "planner/cost_model/analytic_cost_model.h"
#include "planner/cost_model/profile_cost_model.h"
#include "planner/cost_model/refit_cost_model.h"
#include "planner/partition/global_batches.h"
#include "src/data/dataset.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/safetensors/weight_set.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::planner::service {

namespace {

// The job's cost model: its measured profile (with the terms it measured,
// when it has them), else the analytic model of its device.
absl::StatusOr<std::shared_ptr<const LayerCostModel>> LoadCostModel(const proto::JobSpec& spec,
                                                                    const spec::JobPaths& paths) {
  if (spec.cost_profile_path().empty()) {
    ASSIGN_OR_RETURN(auto model, AnalyticCostModel::Create(spec.model(), spec.cluster().device(), {}));
    return std::shared_ptr<const LayerCostModel>(std::move(model));
  }
  const std::string& path = paths.cost_profile;
  proto::CostProfile profile;
  RETURN_IF_ERROR(Annotate(LoadProtoFileQuietly(path, &profile), "cost_profile_path"));
  const auto& m = spec.model();
  const int kv_heads = profile.kv_heads() > 0 ? profile.kv_heads() : profile.heads();
  if (profile.hidden() != m.hidden() || (profile.heads() > 0 && profile.heads() != m.heads()) ||
      (profile.ffn() > 0 && profile.ffn() != m.ffn()) || (kv_heads > 0 && kv_heads != m.kv_heads())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost_profile_path: ", spec.cost_profile_path(), " profiles hidden ", profile.hidden(), ", heads ",
        profile.heads(), ", kv_heads ", kv_heads, ", ffn ", profile.ffn(), "; the model has hidden ", m.hidden(),
        ", heads ", m.heads(), ", kv_heads ", m.kv_heads(), ", ffn ", m.ffn()));
  }
  if (profile.model_kind() != proto::ModelKind::unspecified && profile.model_kind() != m.kind()) {
    return absl::InvalidArgumentError(absl::StrCat("cost_profile_path: ", spec.cost_profile_path(), " profiles a ",
                                                   proto::ModelKind::Value_Name(profile.model_kind()),
                                                   " model; the job's is ", proto::ModelKind::Value_Name(m.kind())));
  }
  auto model = ProfileCostModel::Create(profile, m.dtype() == proto::DType::fp32 ? 4 : 2);
  if (!model.ok()) return Annotate(model.status(), absl::StrCat("cost_profile_path: ", spec.cost_profile_path()));
  std::shared_ptr<const LayerCostModel> cost = std::move(*model);
  if (profile.has_measured()) {
    // What the job measured when it was profiled: in full under the same
    // layout, else the terms that do not depend on it.
    const proto::MeasuredTerms& t = profile.measured();
    const bool same_layout = t.pp() == spec.parallelism().pp() && t.dp() == spec.parallelism().dp();
    cost = std::make_shared<RefitCostModel>(std::move(cost), FromProto(t, same_layout));
  }
  return cost;
}

// The samples' lengths, from an indexed dataset (whose token ids the model's
// vocabulary must cover) or a lengths file.
absl::StatusOr<std::vector<data::RawLength>> ReadSampleLengths(const proto::JobSpec& spec,
                                                               const std::string& dataset_path,
                                                               const std::string& data_root) {
  if (spec.dataset().format() != proto::DatasetSpec::indexed) {
    auto lengths = data::ReadLengths(dataset_path, /*indexed=*/false);
    if (!lengths.ok()) return Annotate(lengths.status(), "dataset.path");
    return std::move(*lengths);
  }
  // The files inside the directory too: each may be a link leading out.
  RETURN_IF_ERROR(Annotate(data::CheckDatasetConfined(data_root, dataset_path), "dataset.path"));
  auto dataset = data::Dataset::Open(dataset_path);
  if (!dataset.ok()) return Annotate(dataset.status(), "dataset.path");
  // Caught here, not at the first forward pass of every executor.
  if ((*dataset)->info().vocab() > static_cast<uint32_t>(spec.model().vocab())) {
    return absl::InvalidArgumentError(absl::StrCat("model.vocab: ", spec.model().vocab(), " is smaller than the ",
                                                   (*dataset)->info().vocab(), " token ids of dataset ",
                                                   spec.dataset().path()));
  }
  return (*dataset)->Lengths();
}

// The global batches of batching.global_batch_tokens each, checked against
// the planner's bound on samples per batch and the data-parallel width.
absl::StatusOr<std::vector<std::vector<Sample>>> GlobalBatches(const proto::JobSpec& spec, const PlannerConfig& config,
                                                              const std::vector<data::RawLength>& raw) {
  const bool ed = spec.model().kind() == proto::ModelKind::t5;
  std::vector<Sample> samples;
  samples.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) samples.push_back(Truncate(static_cast<int64_t>(i), raw[i], config.max_seq_len, ed));
  int64_t dataset_tokens = 0;
  for (const Sample& s : samples) dataset_tokens += SampleTokens(s, ed);
  const int64_t batch_tokens = spec.batching().global_batch_tokens();
  if (batch_tokens > dataset_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batching.global_batch_tokens: ", batch_tokens,
                                                   " exceeds the dataset's ", dataset_tokens, " tokens (",
                                                   samples.size(), " samples, truncated to max_seq_len ",
                                                   config.max_seq_len, ")"));
  }
  std::vector<std::vector<Sample>> batches = FormGlobalBatches(samples, batch_tokens, ed);
  for (const auto& b : batches) {
    if (static_cast<int64_t>(b.size()) > spec::kMaxSamplesPerGlobalBatch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batching.global_batch_tokens: ", batch_tokens, " tokens make global batches of ", b.size(),
          " samples; planning is bounded to ", spec::kMaxSamplesPerGlobalBatch,
          " samples per global batch (lower it to about ",
          batch_tokens * spec::kMaxSamplesPerGlobalBatch / static_cast<int64_t>(b.size()), ")"));
    }
    if (static_cast<int>(b.size()) < config.dp) {
      return absl::InvalidArgumentError(absl::StrCat("batching.global_batch_tokens: a global batch of ", b.size(),
                                                     " samples cannot feed ", config.dp, " data-parallel groups"));
    }
  }
  return batches;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const JobRuntime>> BuildJobRuntime(const spec::NormalizedJobSpec& normalized,
                                                                 const std::string& job_id,
                                                                 const std::string& data_root) {
  const proto::JobSpec& spec = normalized.proto();
  ASSIGN_OR_RETURN(PlannerConfig config, PlannerConfigFromJob(normalized));
  config.job_id = job_id;
  // Every path a job names stays under data_root.
  ASSIGN_OR_RETURN(const spec::JobPaths paths, spec::ConfineJobPaths(normalized, data_root));
  if (!paths.init_from.empty()) {
    // Refused at Submit rather than when the ranks start: a missing or
    // malformed weights file (each header checked; the tensors against the
    // model when the stages load them).
    if (absl::StatusOr<safetensors::WeightSet> w = safetensors::WeightSet::Open(paths.init_from); !w.ok()) {
      return absl::Status(w.status().code(), absl::StrCat("model.init_from: ", w.status().message()));
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const LayerCostModel> cost, LoadCostModel(spec, paths));
  auto runtime = std::make_shared<JobRuntime>(normalized);
  ASSIGN_OR_RETURN(runtime->planner, Planner::Create(config, cost));
  if (spec.cost_refit().mode() == proto::CostRefitSpec::on) {
    runtime->refit = std::make_shared<JobRefit>(runtime->planner, spec.cost_refit());
  }
  ASSIGN_OR_RETURN(const std::vector<data::RawLength> raw, ReadSampleLengths(spec, paths.dataset, data_root));
  ASSIGN_OR_RETURN(runtime->batches, GlobalBatches(spec, config, raw));
  return std::shared_ptr<const JobRuntime>(std::move(runtime));
}

std::shared_ptr<const JobRuntime> ForJob(const JobRuntime& rt, const std::string& job_id) {
  auto out = std::make_shared<JobRuntime>(rt.spec);
  out->planner = rt.planner->ForJob(job_id);
  if (rt.refit) out->refit = std::make_shared<JobRefit>(out->planner, rt.spec->cost_refit());
  out->batches = rt.batches;
  return out;
}

}  // namespace dynapipe::planner::service
