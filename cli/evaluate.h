#pragma once

// Held-out evaluation of a trained model: the whole model is rebuilt in one
// process from the checkpoint shards of data-parallel group 0 (every pipeline
// stage), then every sample's target tokens are predicted with teacher
// forcing. Reported per task: token accuracy and exact match (every target
// token right).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "src/data/dataset.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cpu_stage.h"

namespace dynapipe::cli {

// The whole model on one CPU stage (a GPT or a T5 stage, by model.kind),
// from the checkpoint's shards; `iteration` < 0: as initialised from the
// job's seed.
absl::StatusOr<std::unique_ptr<runtime::model::CpuStageBase>> LoadWholeModel(const proto::JobSpec& spec, const std::string& dir,
                                                                int64_t iteration, runtime::BufferPool* pool);

struct TaskAccuracy {
  std::string task;
  int64_t samples = 0, exact = 0;
  int64_t tokens = 0, correct = 0;
};

// The first `max_samples` samples of `dataset` (truncated to the model's
// positions like training does), one row each; a T5 reads the input and
// predicts the target with teacher forcing, as it trains.
absl::StatusOr<std::vector<TaskAccuracy>> Evaluate(runtime::model::CpuStageBase& model, const data::Dataset& dataset,
                                                   int64_t max_samples, int max_seq_len);

}  // namespace dynapipe::cli
