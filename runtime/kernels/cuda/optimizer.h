#pragma once

// AdamW on fp32 master weights with the bf16 compute copy, and the sum of
// squares behind the global gradient norm. Same math as the CPU's
// runtime/optim/adamw.h (decoupled weight decay, bias correction
// 1 - beta^step); arithmetic here is fp32 per element, the bias corrections
// are computed in double on the host. Launchers are asynchronous on `stream`
// and return the launch status.
//
// A launch updates one contiguous range with one weight decay. Which
// parameters decay is the caller's business: the GPT stage
// (runtime/model/gpt_cuda.h) launches once per run of the layout's decay
// group (GptLayout::DecayRuns(true), matrices) with the job's weight decay
// and once per run of the rest (biases, LayerNorm gains) with 0, as the CPU
// stage does.
//
// Gradient clipping: the caller sums SumOfSquares over the runs of the
// layout's norm group (GptLayout::NormRuns) into one device double, copies it
// to the host, takes sqrt, and passes the clipping factor
// (optim::ClipByGlobalNorm's rule) as AdamWParams::grad_scale, so the
// gradients are never rescaled in a separate pass.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // counts from 1
  float grad_scale = 1;  // multiplies every gradient first (the clipping factor)
};

// One fused AdamW update of n parameters: g = grad_scale * grads; m, v
// updated; params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params);
// params_bf16 (if not null) = bf16(params), round to nearest even. Uses
// 16-byte vector loads when params, grads, m, v are 16-byte aligned and
// params_bf16 is 8-byte aligned, scalar code otherwise.
absl::Status AdamWStep(float* params,              // (n) fp32 master, updated
                       __nv_bfloat16* params_bf16,  // (n) compute copy, written, or null
                       const float* grads,          // (n)
                       float* m,                    // (n) first moment, updated
                       float* v,                    // (n) second moment, updated
                       int64_t n, const AdamWParams& p, cudaStream_t stream);

// *out += sum of x[i]^2, accumulated in double. Deterministic (bitwise, for a
// given n and pointer alignment): per-block partials in a stream-ordered
// temporary (cudaMallocAsync), then one block adds them in a fixed order.
absl::Status SumOfSquares(const float* x,  // (n)
                          int64_t n,
                          double* out,  // () device scalar, +=
                          cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
