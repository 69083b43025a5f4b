#include "benchmarks/plan_dump.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "planner/service/job_runtime.h"
#include "src/data/dataset.h"
#include "runtime/model/batch.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::benchmarks {

namespace {

using runtime::model::Recompute;

Recompute FromProto(proto::RecomputeLevel::Value v) {
  switch (v) {
    case proto::RecomputeLevel::selective: return Recompute::kSelective;
    case proto::RecomputeLevel::full: return Recompute::kFull;
    default: return Recompute::kNone;
  }
}

}  // namespace

absl::StatusOr<BatchDump> DumpPlans(const proto::JobSpec& job, const std::string& data_root, int64_t iterations) {
  if (iterations <= 0) return absl::InvalidArgumentError("iterations: must be positive");
  proto::JobSpec spec = job;
  spec.set_iterations(std::max<int64_t>(spec.iterations(), iterations));
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::NormalizedJobSpec::Normalize(spec));
  ASSIGN_OR_RETURN(auto rt, planner::service::BuildJobRuntime(normalized, "dump", data_root));
  if (rt->world() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism: the dump is one stage's view; got pp ",
                                                   rt->planner->config().pp, " x dp ", rt->planner->config().dp));
  }
  const proto::JobSpec& s = rt->spec.proto();
  ASSIGN_OR_RETURN(const spec::JobPaths paths, spec::ConfineJobPaths(rt->spec, data_root));
  ASSIGN_OR_RETURN(std::unique_ptr<data::Dataset> dataset, data::Dataset::Open(paths.dataset));
  BatchDump d;
  d.job_name = s.name();
  d.method = proto::BatchingSpec::Method_Name(s.batching().method());
  ASSIGN_OR_RETURN(d.config, runtime::model::GptConfig::FromSpec(s.model()));
  d.seed = s.seed();
  d.adamw = runtime::optim::FromSpec(s.optimizer());
  d.grad_clip = s.optimizer().grad_clip();
  for (int64_t i = 0; i < iterations; ++i) {
    ASSIGN_OR_RETURN(planner::IterationPlan p, rt->planner->Plan(rt->batch(i), i));
    const proto::ExecutionPlan& plan = p.plans.at(0);
    IterationDump it;
    // The worker's arithmetic, as Worker::RunIteration and OptimizerStep do it.
    it.loss_scale = 1.0f / static_cast<float>(plan.global_loss_tokens());
    it.lr = runtime::optim::LearningRate(s.optimizer(), i);
    it.predicted_ms = p.predicted_ms;
    it.batches.resize(plan.micro_batches_size());
    it.recompute.assign(plan.micro_batches_size(), Recompute::kNone);
    std::vector<bool> built(plan.micro_batches_size(), false);
    for (const proto::Instruction& ins : plan.instructions()) {
      const bool fwd = ins.op_case() == proto::Instruction::kForward;
      if (!fwd && ins.op_case() != proto::Instruction::kBackward) continue;
      const int mb = ins.micro_batch();
      if (mb < 0 || mb >= plan.micro_batches_size()) {
        return absl::InternalError(absl::StrCat("iteration ", i, ": plan names micro-batch ", mb));
      }
      if (fwd) {
        ASSIGN_OR_RETURN(it.batches[mb],
                         runtime::model::BuildTokenBatch(plan.micro_batches(mb), *dataset, s.model().max_positions(),
                                                         s.model().kind() == proto::ModelKind::t5));
        it.recompute[mb] = FromProto(ins.forward().recompute());
        built[mb] = true;
      }
      it.steps.push_back({fwd, mb});
    }
    if (std::find(built.begin(), built.end(), false) != built.end()) {
      return absl::InternalError(absl::StrCat("iteration ", i, ": a micro-batch is never forwarded"));
    }
    d.iterations.push_back(std::move(it));
  }
  runtime::model::StageOptions o;
  o.num_layers = d.config.num_layers;
  o.seed = d.seed;
  ASSIGN_OR_RETURN(const runtime::model::GptLayout layout, runtime::model::GptLayout::Make(d.config, o));
  std::vector<float> init(layout.num_params());
  layout.Initialize(init);
  for (const runtime::model::ParamInfo& p : layout.params()) {
    d.params.push_back({p.name, p.shape, std::vector<float>(init.begin() + p.offset, init.begin() + p.offset + p.size)});
  }
  return d;
}

}  // namespace dynapipe::benchmarks
