#pragma once

// The small element-wise kernels of the GPT stage (runtime/model/gpt_cuda.h):
// the residual add, and the gather / scatter of the rows the LM head scores
// (bf16 in and out, fp32 arithmetic, one rounding per written element); and
// the fp32 sum the CUDA backend (runtime/backend/cuda_backend.h) uses for the
// two copies of a tied embedding's gradient.
// Launchers are asynchronous on `stream` and return the launch status. Row
// indices are trusted to lie inside the indexed tensor (not checked on the
// device, as the embedding's token ids: its row count is not even passed).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// out[i] = a[i] + b[i] (fp32 sum, rounded once). out may alias a or b (the
// element is read before it is written, by the same thread); partial overlaps
// are not allowed.
absl::Status ResidualAdd(__nv_bfloat16* out,      // (n)
                         const __nv_bfloat16* a,  // (n)
                         const __nv_bfloat16* b,  // (n)
                         int64_t n, cudaStream_t stream);

// x[i] *= s in place (fp32 product, rounded once): T5's tied head scales
// its input by hidden^-0.5, and its gradient likewise.
absl::Status Scale(__nv_bfloat16* x,  // (n)
                   float s, int64_t n, cudaStream_t stream);

// out[i] = a[i] + b[i] in fp32 (the CPU's `a[i] + b[i]`, bit for bit). out may
// alias a or b, as ResidualAdd.
absl::Status AddF32(float* out,      // (n)
                    const float* a,  // (n)
                    const float* b,  // (n)
                    int64_t n, cudaStream_t stream);

// out[r, :] = in[rows[r], :]. Rows may repeat. out must not overlap in.
absl::Status GatherRows(__nv_bfloat16* out,       // (M, C)
                        const __nv_bfloat16* in,  // (N, C), N > every rows[r]
                        const int32_t* rows,      // (M) device, in [0, N)
                        int64_t M, int64_t C, cudaStream_t stream);

// out[rows[r], :] += in[r, :] (read, add in fp32, round once). The rows must
// be distinct (no atomics: two equal rows would race). out must not overlap in.
absl::Status ScatterAddRows(__nv_bfloat16* out,       // (N, C), +=
                            const __nv_bfloat16* in,  // (M, C)
                            const int32_t* rows,      // (M) device, distinct, in [0, N)
                            int64_t M, int64_t C, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
