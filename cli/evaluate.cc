#include "cli/evaluate.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "planner/partition/global_batches.h"
#include "src/checkpoint/checkpoint.h"
#include "runtime/model/batch.h"
#include "runtime/model/gpt.h"
#include "runtime/model/t5.h"
#include "src/common/status_macros.h"

namespace dynapipe::cli {

namespace {

absl::StatusOr<std::unique_ptr<runtime::model::CpuStageBase>> WholeStage(const runtime::model::GptConfig& config,
                                                                         uint64_t seed, runtime::BufferPool* pool) {
  const runtime::model::StageOptions whole{0, config.TotalLayers(), true, true, seed};
  if (config.encoder_decoder) {
    ASSIGN_OR_RETURN(auto t5, runtime::model::T5Stage::Create(config, whole, pool));
    return std::unique_ptr<runtime::model::CpuStageBase>(std::move(t5));
  }
  ASSIGN_OR_RETURN(auto gpt, runtime::model::GptStage::Create(config, whole, pool));
  return std::unique_ptr<runtime::model::CpuStageBase>(std::move(gpt));
}

}  // namespace

absl::StatusOr<std::unique_ptr<runtime::model::CpuStageBase>> LoadWholeModel(const proto::JobSpec& spec,
                                                                             const std::string& dir,
                                                                             int64_t iteration,
                                                                             runtime::BufferPool* pool) {
  ASSIGN_OR_RETURN(const runtime::model::GptConfig config, runtime::model::GptConfig::FromSpec(spec.model()));
  ASSIGN_OR_RETURN(auto whole, WholeStage(config, spec.seed(), pool));
  if (iteration < 0) return whole;
  const int pp = std::max(1, spec.parallelism().pp());
  std::map<std::string, bool> filled;
  for (int r = 0; r < pp; ++r) {  // data-parallel group 0 holds ranks 0..pp-1
    ASSIGN_OR_RETURN(const checkpoint::Shard shard, checkpoint::ReadShard(dir, iteration, r));
    for (const checkpoint::Tensor& t : shard.params) {
      const runtime::model::ParamInfo* p = whole->FindParam(t.name);
      if (p == nullptr || p->size != t.data.size()) {
        return absl::DataLossError(absl::StrCat(checkpoint::ShardPath(dir, iteration, r), ": tensor ", t.name,
                                                " does not fit the job's model"));
      }
      std::copy(t.data.begin(), t.data.end(), whole->param_data().begin() + p->offset);
      filled[t.name] = true;
    }
  }
  for (const runtime::model::ParamInfo& p : whole->layout().params()) {
    if (!filled.contains(p.name)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, " iteration ", iteration, " lacks tensor ", p.name));
    }
  }
  return whole;
}

absl::StatusOr<std::vector<TaskAccuracy>> Evaluate(runtime::model::CpuStageBase& model, const data::Dataset& dataset,
                                                   int64_t max_samples, int max_seq_len) {
  const auto& info = dataset.info();
  std::vector<TaskAccuracy> out(std::max(1, info.tasks_size()));
  for (int t = 0; t < info.tasks_size(); ++t) out[t].task = info.tasks(t);
  const int V = model.config().vocab;
  const bool ed = model.config().encoder_decoder;
  const int max_len = std::min(max_seq_len, model.config().max_positions);
  std::vector<float> logits;
  const int64_t n = std::min<int64_t>(max_samples, static_cast<int64_t>(dataset.size()));
  for (int64_t i = 0; i < n; ++i) {
    const data::SampleView sv = dataset.sample(static_cast<uint64_t>(i));
    const planner::Sample s = planner::Truncate(
        i, {static_cast<int64_t>(sv.input.size()), static_cast<int64_t>(sv.target.size())}, max_len, ed);
    if (ed && (s.input <= 0 || s.target <= 0)) continue;  // nothing to read or to predict
    proto::MicroBatch mb;
    mb.set_rows(1);
    mb.set_seq_len(s.input);
    if (ed) mb.set_dec_seq_len(s.target);
    auto* ps = mb.add_samples();
    ps->set_id(i);
    ps->set_input_len(s.input);
    ps->set_target_len(s.target);
    ASSIGN_OR_RETURN(const runtime::model::TokenBatch b, runtime::model::BuildTokenBatch(mb, dataset, model.config().max_positions, ed));
    logits.resize(static_cast<size_t>(b.seq) * V);
    RETURN_IF_ERROR(model.Infer(b, nullptr, logits.data()));
    TaskAccuracy& acc = out[std::min<size_t>(sv.task, out.size() - 1)];
    bool all = true;
    int64_t scored = 0;
    for (int64_t p = 0; p < b.seq; ++p) {
      if (b.targets[p] < 0) continue;
      const float* row = logits.data() + p * V;
      const int best = static_cast<int>(std::max_element(row, row + V) - row);
      ++scored;
      ++acc.tokens;
      if (best == b.targets[p]) {
        ++acc.correct;
      } else {
        all = false;
      }
    }
    if (scored > 0) {
      ++acc.samples;
      acc.exact += all ? 1 : 0;
    }
  }
  return out;
}

}  // namespace dynapipe::cli
