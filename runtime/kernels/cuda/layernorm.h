#pragma once

// LayerNorm and RMS norm over the last dimension on bf16 activations: fp32
// statistics (two-pass mean then variance, so rows with a large mean keep
// their precision), fp32 parameter gradients; the epsilon is the caller's
// (model.block.norm_eps). Launchers are asynchronous on `stream` and return
// the launch status.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// out = (inp - mean) * rstd * weight + bias per row; stores each row's mean
// and rstd = 1 / sqrt(var + eps) (biased variance) for the backward pass.
// bias may be null (a block without biases: no shift). eps: the model's
// (GptConfig::NormEps; GPT-2's 1e-5), positive.
absl::Status LayerNormForward(__nv_bfloat16* out,            // (N, C)
                              float* mean,                   // (N)
                              float* rstd,                   // (N)
                              const __nv_bfloat16* inp,      // (N, C)
                              const __nv_bfloat16* weight,   // (C)
                              const __nv_bfloat16* bias,     // (C) or null
                              int64_t N, int64_t C, float eps, cudaStream_t stream);

// dinp += LayerNorm input gradient (per row; read, add in fp32, round once);
// dweight += sum_i norm_i * dout_i and dbias += sum_i dout_i (column sums in
// fp32: per-block partial sums, then fp32 atomicAdd into the outputs, so these
// two are NOT bitwise deterministic from run to run). dinp must not overlap
// dout or inp. dbias may be null (no shift).
absl::Status LayerNormBackward(__nv_bfloat16* dinp,          // (N, C), +=
                               float* dweight,               // (C), +=
                               float* dbias,                 // (C) or null, +=
                               const __nv_bfloat16* dout,    // (N, C)
                               const __nv_bfloat16* inp,     // (N, C)
                               const __nv_bfloat16* weight,  // (C)
                               const float* mean,            // (N)
                               const float* rstd,            // (N)
                               int64_t N, int64_t C, cudaStream_t stream);

// RMS norm (T5's, Llama's): out = inp * rstd * weight per row, rstd = 1 /
// sqrt(mean(inp^2) + eps) stored for backward; eps as LayerNormForward's
// (T5's 1e-6, Llama's 1e-5).
absl::Status RmsNormForward(__nv_bfloat16* out,           // (N, C)
                            float* rstd,                  // (N)
                            const __nv_bfloat16* inp,     // (N, C)
                            const __nv_bfloat16* weight,  // (C)
                            int64_t N, int64_t C, float eps, cudaStream_t stream);

// dinp += rstd (weight dout) - inp rstd^3 mean(inp weight dout) (per row; read,
// add in fp32, round once); dweight += sum_i inp_i rstd_i dout_i (fp32
// atomics, as LayerNormBackward). dinp must not overlap dout or inp.
absl::Status RmsNormBackward(__nv_bfloat16* dinp,          // (N, C), +=
                             float* dweight,               // (C), +=
                             const __nv_bfloat16* dout,    // (N, C)
                             const __nv_bfloat16* inp,     // (N, C)
                             const __nv_bfloat16* weight,  // (C)
                             const float* rstd,            // (N)
                             int64_t N, int64_t C, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
