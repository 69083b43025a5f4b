#include "benchmarks/train_on_dump.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/model/stage.h"
#include "runtime/optim/adamw.h"
#include "src/common/status_macros.h"

namespace dynapipe::benchmarks {

absl::StatusOr<std::vector<TrainedIteration>> TrainOnDump(const BatchDump& dump,
                                                          runtime::model::AttentionKernel attention,
                                                          runtime::Backend& backend, const AroundIteration& around) {
  runtime::model::GptConfig config = dump.config;
  config.attention = attention;
  runtime::model::StageOptions o;
  o.num_layers = config.num_layers;
  o.seed = dump.seed;
  RETURN_IF_ERROR(backend.BindThread());
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::model::Stage> stage, backend.CreateStage(config, o));
  // Start from the dumped parameters (what the other side loads too).
  runtime::model::StageState state;
  if (dump.params.size() != stage->layout().params().size()) {
    return absl::InvalidArgumentError(absl::StrCat("dump holds ", dump.params.size(), " parameters, the model ",
                                                   stage->layout().params().size()));
  }
  for (size_t k = 0; k < dump.params.size(); ++k) {
    const runtime::model::ParamInfo& p = stage->layout().params()[k];
    const DumpParam& d = dump.params[k];
    if (d.name != p.name || d.values.size() != p.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("dump parameter ", d.name, " where the model has ", p.name, " of ", p.size, " values"));
    }
    state.params.insert(state.params.end(), d.values.begin(), d.values.end());
  }
  state.adam_m.assign(state.params.size(), 0.0f);
  state.adam_v.assign(state.params.size(), 0.0f);
  RETURN_IF_ERROR(stage->ImportState(state));

  std::vector<TrainedIteration> out;
  for (size_t i = 0; i < dump.iterations.size(); ++i) {
    const IterationDump& it = dump.iterations[i];
    TrainedIteration r;
    r.real_tokens = it.real_tokens();
    if (around) {
      RETURN_IF_ERROR(backend.Synchronize());
      RETURN_IF_ERROR(around(i, true));
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto since_t0 = [&t0] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    for (const DumpStep& s : it.steps) {
      if (s.forward) {
        RETURN_IF_ERROR(stage->Forward(s.micro_batch, it.batches[s.micro_batch], nullptr, nullptr, it.loss_scale,
                                       it.recompute[s.micro_batch]));
      } else {
        RETURN_IF_ERROR(stage->Backward(s.micro_batch, nullptr, nullptr));
      }
    }
    r.queue_seconds = since_t0();
    ASSIGN_OR_RETURN(r.loss, stage->TakeLoss());  // one wait per iteration, as the executor
    r.compute_seconds = since_t0();
    double sum = 0;
    RETURN_IF_ERROR(stage->AddGradSumOfSquares(&sum));
    r.grad_norm = std::sqrt(sum);
    if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss)) {
      return absl::InternalError(absl::StrCat("iteration ", i, ": non-finite loss ", r.loss, " or norm ", r.grad_norm));
    }
    runtime::model::OptimizerStepArgs args;
    args.adamw = dump.adamw;
    args.lr = it.lr;
    args.step = static_cast<int64_t>(i) + 1;
    args.grad_scale = runtime::optim::ClipFactor(dump.grad_clip, r.grad_norm);
    RETURN_IF_ERROR(stage->OptimizerStep(args));
    RETURN_IF_ERROR(stage->ZeroGrads());
    RETURN_IF_ERROR(backend.Synchronize());  // the device's work, not just its queueing
    r.seconds = since_t0();
    if (around) RETURN_IF_ERROR(around(i, false));
    out.push_back(r);
  }
  return out;
}

}  // namespace dynapipe::benchmarks
