#pragma once

// GELU, tanh approximation (as GPT-2 and the CPU backend), and the other
// feed-forward activations of model.block, on bf16 activations with fp32
// arithmetic. Launchers are asynchronous on `stream` and
// return the launch status.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out may alias inp.
absl::Status GeluForward(__nv_bfloat16* out,        // (n)
                         const __nv_bfloat16* inp,  // (n)
                         int64_t n, cudaStream_t stream);

// dinp += gelu'(inp) * dout (read, add in fp32, round once).
absl::Status GeluBackward(__nv_bfloat16* dinp,       // (n), +=
                          const __nv_bfloat16* inp,  // (n)
                          const __nv_bfloat16* dout, // (n)
                          int64_t n, cudaStream_t stream);

// d = gelu'(inp) * d in place (read, multiply in fp32, round once): the
// gradient through a GELU whose output gradient is already in d.
absl::Status GeluBackwardInPlace(__nv_bfloat16* d,          // (n), in and out
                                 const __nv_bfloat16* inp,  // (n)
                                 int64_t n, cudaStream_t stream);

// The other feed-forward activations of model.block, bf16 with fp32
// arithmetic like GELU. ReLU: out = max(inp, 0); dinp += dout where inp > 0.
absl::Status ReluForward(__nv_bfloat16* out, const __nv_bfloat16* inp, int64_t n, cudaStream_t stream);
absl::Status ReluBackward(__nv_bfloat16* dinp,        // (n), +=
                          const __nv_bfloat16* inp,   // (n)
                          const __nv_bfloat16* dout,  // (n)
                          int64_t n, cudaStream_t stream);

// Gated GELU over rows of [gate | up]: out = gelu(gate) * up (one rounding).
absl::Status GatedGeluForward(__nv_bfloat16* out,        // (N, F)
                              const __nv_bfloat16* inp,  // (N, 2F)
                              int64_t N, int64_t F, cudaStream_t stream);
// dgate += gelu'(gate) * up * dout, dup += gelu(gate) * dout.
absl::Status GatedGeluBackward(__nv_bfloat16* dinp,        // (N, 2F), +=
                               const __nv_bfloat16* inp,   // (N, 2F)
                               const __nv_bfloat16* dout,  // (N, F)
                               int64_t N, int64_t F, cudaStream_t stream);

// SwiGLU (Llama) over rows of [gate | up]: out = silu(gate) * up, silu(x) =
// x / (1 + exp(-x)) (one rounding).
absl::Status SwigluForward(__nv_bfloat16* out,        // (N, F)
                           const __nv_bfloat16* inp,  // (N, 2F)
                           int64_t N, int64_t F, cudaStream_t stream);
// With s = sigmoid(gate): dgate += s (1 + gate (1 - s)) * up * dout, dup +=
// silu(gate) * dout.
absl::Status SwigluBackward(__nv_bfloat16* dinp,        // (N, 2F), +=
                            const __nv_bfloat16* inp,   // (N, 2F)
                            const __nv_bfloat16* dout,  // (N, F)
                            int64_t N, int64_t F, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
