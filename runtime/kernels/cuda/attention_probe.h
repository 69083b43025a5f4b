#pragma once

// The start-up check that decides whether cuDNN's fused attention may run in
// this process (attention_choice.h): one small packed micro-batch (several
// samples per row, padding, a one-token sample) through cuDNN and through the
// tiled kernel, outputs, statistics and gradients compared. The graphs are
// built blind where the project is built (cuDNN needs a device even to
// finalise one), so this is where a graph cuDNN refuses, or one that
// computes something else, shows up: as a reason in the log and /status,
// with the tiled kernel running instead.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/kernels/cuda/cudnn_attention.h"

namespace dynapipe::runtime::cuda {

// OK where cuDNN agrees with the tiled kernel within bf16 rounding (and
// leaves padding tokens untouched); INTERNAL naming the first tensor that
// differs and by how much; cuDNN's and CUDA's errors as they come. Uses its
// own device memory (a few MB) and waits for `stream` with `timeout`.
absl::Status ProbeCudnnAttention(CudnnAttention& attention, int head_dim, cudaStream_t stream,
                                 std::chrono::seconds timeout);

// The same comparison on any micro-batch: segments `seg` (B, T), NH heads of
// `head_dim`, inputs drawn from `seed`.
absl::Status CompareCudnnWithTiled(CudnnAttention& attention, const std::vector<int32_t>& seg, int64_t B, int64_t T,
                                   int64_t NH, int head_dim, uint64_t seed, cudaStream_t stream,
                                   std::chrono::seconds timeout);

}  // namespace dynapipe::runtime::cuda
