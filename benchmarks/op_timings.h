#pragma once

// Our CPU kernels (runtime/kernels/cpu/ops.h, AdamW of runtime/optim) timed
// one by one on the shapes of a dump's micro-batches: each op is called once
// per micro-batch of the chosen iterations (one layer's worth), on random
// data of those shapes; a pass sums the calls' time. One untimed pass warms
// up, then `reps` passes are timed and the median pass is reported.
// benchmarks/torch_gpt.py times the same list the same way.
//
// Ops, forward and backward each (name_fwd, name_bwd), N = rows x seq of a
// micro-batch, M = its scored tokens:
//   matmul_qkv (N, C -> 3C)  matmul_proj (N, C -> C)  matmul_fc (N, C -> F)
//   matmul_mproj (N, F -> C)  matmul_head (M, C -> V, no bias)
//   layernorm (N, C)  gelu (N x F)  crossentropy (M, V)
//   attention_varlen, attention_materialized (rows, seq, C, heads; the dump's segments)
// and adamw: one step over every parameter (decay on matrices), once per
// chosen iteration.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmarks/batch_dump.h"

namespace dynapipe::benchmarks {

struct OpTimingOptions {
  std::vector<int> iterations = {0};  // whose micro-batches give the shapes
  int reps = 5;
  uint64_t seed = 1;  // of the random data
};

struct OpTiming {
  std::string op;
  double seconds = 0;  // median pass
  int calls = 0;       // per pass
};

absl::StatusOr<std::vector<OpTiming>> TimeOps(const BatchDump& dump, const OpTimingOptions& options);

}  // namespace dynapipe::benchmarks
