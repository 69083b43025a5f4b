#pragma once

// A dump of the micro-batches our planner gives a job, for running the same
// training elsewhere (benchmarks/torch_gpt.py) and for benchmarking our CPU
// stage on exactly those shapes. Written as two files beside each other:
//
//   PREFIX.txt  the manifest, one record per line, space-separated:
//     # comment
//     model layers=L hidden=C heads=NH ffn=F vocab=V max_positions=P tie_embeddings=0|1 seed=S
//     optimizer lr=.. beta1=.. beta2=.. eps=.. weight_decay=.. grad_clip=..
//     job name=NAME method=dynamic|packing|padding
//     iteration I loss_scale=X lr=X micro_batches=K steps=f0,b0,f1,b1,...
//     micro_batch I J rows=R seq=T real_tokens=.. loss_tokens=.. recompute=none|selective|full
//     tensor NAME i32|f32 D0 D1 ...
//   PREFIX.bin  the tensors of the `tensor` lines back to back, in manifest
//               order, little-endian.
//
// Tensors: it<I>.mb<J>.{tokens,positions,segments,targets} (i32, rows x seq)
// per micro-batch, then param.<name> (f32) for each initial parameter of the
// one-stage model, in GptLayout order. `steps` is the executor's order of
// forwards (f) and backwards (b) by micro-batch index; loss_scale is the
// float the worker multiplies each scored token's loss by (1 / loss tokens
// of the global batch); lr is the schedule's rate for that iteration.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/layout.h"
#include "runtime/optim/adamw.h"

namespace dynapipe::benchmarks {

struct DumpStep {
  bool forward = true;
  int micro_batch = 0;
};

struct IterationDump {
  float loss_scale = 0;
  double lr = 0;
  double predicted_ms = 0;  // our planner's prediction for the iteration (0: not known)
  std::vector<runtime::model::TokenBatch> batches;  // by micro-batch index
  std::vector<runtime::model::Recompute> recompute;  // per micro-batch
  std::vector<DumpStep> steps;                       // execution order
  int64_t real_tokens() const;
};

// Model FLOPs of training on `batch` once (forward + backward, no
// recomputation; what MFU counts): 3x the forward's 2 FLOPs per weight per
// real token in the transformer layers, per scored token in the LM head,
// and 4 * hidden per (query, key) pair inside a sample in attention (causal:
// a sample of n tokens has n (n + 1) / 2 pairs). Samples are the runs of
// one segment id within a row.
double ModelFlops(const runtime::model::GptConfig& config, const runtime::model::TokenBatch& batch);

struct DumpParam {
  std::string name;  // GptLayout's
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct BatchDump {
  std::string job_name, method;
  runtime::model::GptConfig config;
  uint64_t seed = 1;
  runtime::optim::AdamWConfig adamw;
  double grad_clip = 0;
  std::vector<IterationDump> iterations;
  std::vector<DumpParam> params;  // initial values, GptLayout order
};

// Writes PREFIX.txt and PREFIX.bin.
absl::Status WriteBatchDump(const BatchDump& dump, const std::string& prefix);

// Reads them back. DATA_LOSS for a manifest and data that disagree;
// INVALID_ARGUMENT (with the line) for a malformed manifest.
absl::StatusOr<BatchDump> ReadBatchDump(const std::string& prefix);

}  // namespace dynapipe::benchmarks
