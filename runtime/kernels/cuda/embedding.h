#pragma once

// Token + position embedding (GPT-2): forward into bf16 activations, backward
// accumulating into fp32 parameter gradients. Launchers are asynchronous on
// `stream` and return the launch status. Token ids and positions are trusted
// to lie in [0, V) and [0, P) (not checked, as in the CPU backend: V and P are
// not even passed).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// out[i, :] = wte[tokens[i], :] + wpe[positions[i], :] (fp32 sum, one rounding);
// wpe and positions both null: out[i, :] = wte[tokens[i], :] (T5, whose
// positions are relative).
absl::Status EmbeddingForward(__nv_bfloat16* out,             // (N, C)
                              const int32_t* tokens,          // (N)
                              const int32_t* positions,       // (N)
                              const __nv_bfloat16* wte,       // (V, C)
                              const __nv_bfloat16* wpe,       // (P, C)
                              int64_t N, int64_t C, cudaStream_t stream);

// dwte[tokens[i], :] += dout[i, :] and dwpe[positions[i], :] += dout[i, :]
// (dwpe and positions both null: no positions).
// Rows hit by several tokens are summed with fp32 atomicAdd, so the result is
// NOT bitwise deterministic from run to run (the order of the additions varies;
// the values agree to fp32 rounding). dwte and dwpe must not overlap.
absl::Status EmbeddingBackward(float* dwte,                   // (V, C), +=
                               float* dwpe,                   // (P, C), +=
                               const __nv_bfloat16* dout,     // (N, C)
                               const int32_t* tokens,         // (N)
                               const int32_t* positions,      // (N)
                               int64_t N, int64_t C, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
