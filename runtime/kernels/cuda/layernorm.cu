#include "runtime/kernels/cuda/layernorm.h"

#include <algorithm>
#include <cmath>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarpsPerBlock = kThreads / kWarp;
// The backward's per-block column sums (dweight and dbias, fp32) live in
// dynamic shared memory while they fit the default 48 KiB; wider rows add
// straight into the global sums.
constexpr int64_t kMaxSharedC = 48 * 1024 / (2 * sizeof(float));

// Blocks for one warp per row, capped (the kernels grid-stride over rows).
int WarpRowGrid(int64_t N) {
  const int64_t blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// One warp per row; the row loop is warp-uniform, so the full-mask shuffles
// in WarpSum see all 32 lanes. Two passes (mean, then the mean of squared
// deviations): no cancellation for rows with a large mean. The row is read
// three times; the later reads mostly hit L1/L2.
__global__ void LayerNormForwardKernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                                       const bf16* bias, int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(blockDim.x / kWarp);
  for (int64_t i = blockIdx.x * warps + threadIdx.x / kWarp; i < N; i += gridDim.x * warps) {
    const bf16* x = inp + i * C;
    float sum = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) sum += ToF32(x[c]);
    const float m = WarpSum(sum) / static_cast<float>(C);
    float sq = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float d = ToF32(x[c]) - m;
      sq += d * d;
    }
    const float var = WarpSum(sq) / static_cast<float>(C);
    const float s = 1.0f / sqrtf(var + eps);
    bf16* o = out + i * C;
    for (int64_t c = lane; c < C; c += kWarp) {
      o[c] = ToBf16((ToF32(x[c]) - m) * s * ToF32(weight[c]) + (bias != nullptr ? ToF32(bias[c]) : 0.0f));
    }
    if (lane == 0) {
      mean[i] = m;
      rstd[i] = s;
    }
  }
}

// One warp per row computes dinp; the column sums for dweight and dbias go to
// per-block fp32 partials in shared memory (kShared) that one atomicAdd per
// column and block adds to the outputs at the end, or straight to the outputs.
template <bool kShared>
__global__ void LayerNormBackwardKernel(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                                        const bf16* weight, const float* mean, const float* rstd, int64_t N,
                                        int64_t C) {
  float* dw = dweight;
  float* db = dbias;
  if constexpr (kShared) {
    extern __shared__ float partial[];  // (2, C): dweight, then dbias
    dw = partial;
    db = partial + C;
    for (int64_t c = threadIdx.x; c < 2 * C; c += blockDim.x) partial[c] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(blockDim.x / kWarp);
  for (int64_t i = blockIdx.x * warps + threadIdx.x / kWarp; i < N; i += gridDim.x * warps) {
    const bf16* x = inp + i * C;
    const bf16* dy = dout + i * C;
    const float m = mean[i];
    const float s = rstd[i];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float norm = (ToF32(x[c]) - m) * s;
      const float dnorm = ToF32(weight[c]) * ToF32(dy[c]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
    }
    const float dnorm_mean = WarpSum(dnorm_sum) / static_cast<float>(C);
    const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / static_cast<float>(C);
    bf16* di = dinp + i * C;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float norm = (ToF32(x[c]) - m) * s;
      const float g = ToF32(dy[c]);
      const float dnorm = ToF32(weight[c]) * g;
      if (db != nullptr) atomicAdd(db + c, g);
      atomicAdd(dw + c, norm * g);
      di[c] = ToBf16(ToF32(di[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
  if constexpr (kShared) {
    __syncthreads();  // outside the row loop: every thread of the block reaches it
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      atomicAdd(dweight + c, dw[c]);
      if (dbias != nullptr) atomicAdd(dbias + c, db[c]);
    }
  }
}

// RMS norm, one warp per row as LayerNormForwardKernel.
__global__ void RmsNormForwardKernel(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int64_t N,
                                     int64_t C, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(blockDim.x / kWarp);
  for (int64_t i = blockIdx.x * warps + threadIdx.x / kWarp; i < N; i += gridDim.x * warps) {
    const bf16* x = inp + i * C;
    float sq = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) sq += ToF32(x[c]) * ToF32(x[c]);
    const float s = 1.0f / sqrtf(WarpSum(sq) / static_cast<float>(C) + eps);
    bf16* o = out + i * C;
    for (int64_t c = lane; c < C; c += kWarp) o[c] = ToBf16(ToF32(x[c]) * s * ToF32(weight[c]));
    if (lane == 0) rstd[i] = s;
  }
}

// dinp per row by one warp; dweight's column sums as LayerNormBackwardKernel's.
template <bool kShared>
__global__ void RmsNormBackwardKernel(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp,
                                      const bf16* weight, const float* rstd, int64_t N, int64_t C) {
  float* dw = dweight;
  if constexpr (kShared) {
    extern __shared__ float partial[];  // (C)
    dw = partial;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) partial[c] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(blockDim.x / kWarp);
  for (int64_t i = blockIdx.x * warps + threadIdx.x / kWarp; i < N; i += gridDim.x * warps) {
    const bf16* x = inp + i * C;
    const bf16* dy = dout + i * C;
    const float s = rstd[i];
    float dot = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) dot += ToF32(x[c]) * ToF32(weight[c]) * ToF32(dy[c]);
    const float k = s * s * s * WarpSum(dot) / static_cast<float>(C);
    bf16* di = dinp + i * C;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float xv = ToF32(x[c]), g = ToF32(dy[c]);
      atomicAdd(dw + c, xv * s * g);
      di[c] = ToBf16(ToF32(di[c]) + ToF32(weight[c]) * g * s - xv * k);
    }
  }
  if constexpr (kShared) {
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dweight + c, dw[c]);
  }
}

// Blocks for the backward kernels that keep column partial sums in shared
// memory: a few per SM, each looping over many rows, keep the global
// atomicAdds of the partials (one per column and block) few.
absl::StatusOr<int> PartialSumGrid(int64_t N) {
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::min(WarpRowGrid(N), 4 * std::max(sms, 1));
}

absl::Status CheckSizes(const char* name, int64_t N, int64_t C) {
  if (N < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": N must be >= 0, got ", N));
  if (C <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": C must be > 0, got ", C));
  return absl::OkStatus();
}

// The forward's epsilon: positive and finite (0 would divide by zero on a
// row of zeros).
absl::Status CheckEps(const char* name, float eps) {
  if (eps > 0.0f && std::isfinite(eps)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, ": eps must be positive and finite, got ", eps));
}

}  // namespace

absl::Status LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                              const bf16* bias, int64_t N, int64_t C, float eps, cudaStream_t stream) {
  if (absl::Status s = CheckSizes("LayerNormForward", N, C); !s.ok()) return s;
  if (absl::Status s = CheckEps("LayerNormForward", eps); !s.ok()) return s;
  if (N == 0) return absl::OkStatus();
  if (out == nullptr || mean == nullptr || rstd == nullptr || inp == nullptr || weight == nullptr) {
    return absl::InvalidArgumentError("LayerNormForward: null device pointer");
  }
  LayerNormForwardKernel<<<WarpRowGrid(N), kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  return CudaStatus(cudaGetLastError(), "LayerNormForward launch");
}

absl::Status LayerNormBackward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                               const bf16* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                               cudaStream_t stream) {
  if (absl::Status s = CheckSizes("LayerNormBackward", N, C); !s.ok()) return s;
  if (N == 0) return absl::OkStatus();
  if (dinp == nullptr || dweight == nullptr || dout == nullptr || inp == nullptr || weight == nullptr ||
      mean == nullptr || rstd == nullptr) {
    return absl::InvalidArgumentError("LayerNormBackward: null device pointer");
  }
  if (C > kMaxSharedC) {
    LayerNormBackwardKernel<false>
        <<<WarpRowGrid(N), kThreads, 0, stream>>>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    return CudaStatus(cudaGetLastError(), "LayerNormBackward launch");
  }
  ASSIGN_OR_RETURN(const int grid, PartialSumGrid(N));
  const size_t smem = static_cast<size_t>(2 * C) * sizeof(float);
  LayerNormBackwardKernel<true>
      <<<grid, kThreads, smem, stream>>>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  return CudaStatus(cudaGetLastError(), "LayerNormBackward launch");
}

absl::Status RmsNormForward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int64_t N, int64_t C,
                            float eps, cudaStream_t stream) {
  if (absl::Status s = CheckSizes("RmsNormForward", N, C); !s.ok()) return s;
  if (absl::Status s = CheckEps("RmsNormForward", eps); !s.ok()) return s;
  if (N == 0) return absl::OkStatus();
  if (out == nullptr || rstd == nullptr || inp == nullptr || weight == nullptr) {
    return absl::InvalidArgumentError("RmsNormForward: null device pointer");
  }
  RmsNormForwardKernel<<<WarpRowGrid(N), kThreads, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
  return CudaStatus(cudaGetLastError(), "RmsNormForward launch");
}

absl::Status RmsNormBackward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                             const float* rstd, int64_t N, int64_t C, cudaStream_t stream) {
  if (absl::Status s = CheckSizes("RmsNormBackward", N, C); !s.ok()) return s;
  if (N == 0) return absl::OkStatus();
  if (dinp == nullptr || dweight == nullptr || dout == nullptr || inp == nullptr || weight == nullptr ||
      rstd == nullptr) {
    return absl::InvalidArgumentError("RmsNormBackward: null device pointer");
  }
  if (C > 2 * kMaxSharedC) {
    RmsNormBackwardKernel<false><<<WarpRowGrid(N), kThreads, 0, stream>>>(dinp, dweight, dout, inp, weight, rstd, N, C);
    return CudaStatus(cudaGetLastError(), "RmsNormBackward launch");
  }
  ASSIGN_OR_RETURN(const int grid, PartialSumGrid(N));
  RmsNormBackwardKernel<true><<<grid, kThreads, static_cast<size_t>(C) * sizeof(float), stream>>>(
      dinp, dweight, dout, inp, weight, rstd, N, C);
  return CudaStatus(cudaGetLastError(), "RmsNormBackward launch");
}

}  // namespace dynapipe::runtime::cuda
