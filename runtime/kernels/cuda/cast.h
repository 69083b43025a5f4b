#pragma once

// Element-wise fills and precision casts (mixed precision: fp32 master
// weights -> bf16 compute copies). Launchers are asynchronous on `stream` and
// return the launch status.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// out[i] = value for i < n.
absl::Status FillF32(float* out,  // (n)
                     float value, int64_t n, cudaStream_t stream);

// out[i] = keyed_normal::Normal(key, i, std) for i < n: the same bits as the
// host generator (src/common/keyed_normal.h).
absl::Status FillKeyedNormal(float* out,  // (n)
                             uint64_t key, float std, int64_t n, cudaStream_t stream);

// out[i] = bf16(in[i]), round to nearest even; bf16 is stored as uint16_t bits.
absl::Status CastF32ToBf16(const float* in,  // (n)
                           uint16_t* out,    // (n)
                           int64_t n, cudaStream_t stream);

// out[i] = float(in[i]) (exact).
absl::Status CastBf16ToF32(const uint16_t* in,  // (n)
                           float* out,          // (n)
                           int64_t n, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
