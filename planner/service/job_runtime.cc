#include "planner/service/job_runtime.h"

#include "absl/strings/str_cat.h"
#include "planner/cost_model/analytic_cost_model.h"
#include "planner/cost_model/profile_cost_model.h"
#include "planner/partition/global_batches.h"
#include "runtime/data/dataset.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

absl::StatusOr<std::shared_ptr<const JobRuntime>> BuildJobRuntime(const proto::JobSpec& spec, const std::string& job_id,
                                                                 const std::string& data_root) {
  if (spec.iterations() <= 0) return absl::InvalidArgumentError("iterations: must be positive");
  if (spec.dataset().path().empty()) return absl::InvalidArgumentError("dataset.path: must be set");
  if (spec.planner_lookahead() < 0) return absl::InvalidArgumentError("planner_lookahead: must be positive");
  if (spec.checkpoint().interval() < 0) return absl::InvalidArgumentError("checkpoint.interval: must not be negative");
  if (spec.checkpoint().dir().empty() && (spec.checkpoint().interval() > 0 || spec.checkpoint().resume())) {
    return absl::InvalidArgumentError("checkpoint.dir: must be set to write or resume checkpoints");
  }
  ASSIGN_OR_RETURN(PlannerConfig config, PlannerConfigFromJob(spec));
  config.job_id = job_id;
  std::shared_ptr<const LayerCostModel> cost;
  if (!spec.cost_profile_path().empty()) {
    // Relative paths resolve under data_root, like the dataset's.
    const std::string path = ResolvePath(data_root, spec.cost_profile_path());
    proto::CostProfile profile;
    RETURN_IF_ERROR(Annotate(LoadProtoFile(path, &profile), "cost_profile_path"));
    const int64_t ffn = spec.model().ffn() > 0 ? spec.model().ffn() : 4 * int64_t{spec.model().hidden()};
    if (profile.hidden() != spec.model().hidden() || (profile.heads() > 0 && profile.heads() != spec.model().heads()) ||
        (profile.ffn() > 0 && profile.ffn() != ffn)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cost_profile_path: ", path, " profiles hidden ", profile.hidden(), ", heads ", profile.heads(), ", ffn ",
          profile.ffn(), "; the model has hidden ", spec.model().hidden(), ", heads ", spec.model().heads(), ", ffn ",
          ffn));
    }
    auto model = ProfileCostModel::Create(profile, spec.model().dtype() == proto::DType::fp32 ? 4 : 2);
    if (!model.ok()) return Annotate(model.status(), absl::StrCat("cost_profile_path: ", path));
    cost = std::move(*model);
  } else {
    ASSIGN_OR_RETURN(auto model, AnalyticCostModel::Create(spec.model(), spec.cluster().device(), {}));
    cost = std::move(model);
  }
  auto runtime = std::make_shared<JobRuntime>();
  runtime->spec = spec;
  ASSIGN_OR_RETURN(runtime->planner, Planner::Create(config, cost));
  auto raw = runtime::data::ReadLengths(ResolvePath(data_root, spec.dataset().path()),
                                       spec.dataset().format() == proto::DatasetSpec::indexed);
  if (!raw.ok()) return Annotate(raw.status(), "dataset.path");
  const bool ed = spec.model().kind() == proto::ModelKind::t5;
  std::vector<Sample> samples;
  samples.reserve(raw->size());
  for (size_t i = 0; i < raw->size(); ++i) samples.push_back(Truncate(static_cast<int64_t>(i), (*raw)[i], config.max_seq_len, ed));
  const int64_t budget = spec.batching().global_batch_tokens() > 0 ? spec.batching().global_batch_tokens() : 65536;
  runtime->batches = FormGlobalBatches(samples, budget, ed);
  for (const auto& b : runtime->batches) {
    if (static_cast<int>(b.size()) < config.dp) {
      return absl::InvalidArgumentError(absl::StrCat("batching.global_batch_tokens: a global batch of ", b.size(),
                                                     " samples cannot feed ", config.dp, " data-parallel groups"));
    }
  }
  return std::shared_ptr<const JobRuntime>(std::move(runtime));
}

}  // namespace dynapipe::planner::service
