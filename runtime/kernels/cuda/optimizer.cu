#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"
#include "runtime/kernels/cuda/optimizer.h"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

bool AlignedTo(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- AdamW -----------------------------------------------------------------

// Per-call constants, prepared on the host (bias corrections in double, as
// optim::AdamWStep computes them, then rounded once).
struct AdamWConsts {
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, bc1, bc2, grad_scale;
};

// optim::AdamWStep for one element, in fp32.
__device__ __forceinline__ void AdamWUpdate(float& p, float g, float& m, float& v, const AdamWConsts& c) {
  g *= c.grad_scale;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  const float mhat = m / c.bc1, vhat = v / c.bc2;
  p = p - c.lr * (mhat / (sqrtf(vhat) + c.eps) + c.weight_decay * p);
}

__global__ void AdamWScalarKernel(float* __restrict__ params, bf16* __restrict__ params_bf16,
                                  const float* __restrict__ grads, float* __restrict__ m, float* __restrict__ v,
                                  int64_t n, AdamWConsts c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float p = params[i], mi = m[i], vi = v[i];
    AdamWUpdate(p, grads[i], mi, vi, c);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (params_bf16 != nullptr) params_bf16[i] = ToBf16(p);
  }
}

// Requires params, grads, m, v 16-byte aligned and params_bf16 8-byte aligned:
// float4 over the first n / 4 * 4 elements, scalar over the rest.
__global__ void AdamWVectorKernel(float* __restrict__ params, bf16* __restrict__ params_bf16,
                                  const float* __restrict__ grads, float* __restrict__ m, float* __restrict__ v,
                                  int64_t n, AdamWConsts c) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t n4 = n / 4;
  for (int64_t i = tid; i < n4; i += stride) {
    float4 p = reinterpret_cast<const float4*>(params)[i];
    const float4 g = reinterpret_cast<const float4*>(grads)[i];
    float4 mi = reinterpret_cast<const float4*>(m)[i];
    float4 vi = reinterpret_cast<const float4*>(v)[i];
    AdamWUpdate(p.x, g.x, mi.x, vi.x, c);
    AdamWUpdate(p.y, g.y, mi.y, vi.y, c);
    AdamWUpdate(p.z, g.z, mi.z, vi.z, c);
    AdamWUpdate(p.w, g.w, mi.w, vi.w, c);
    reinterpret_cast<float4*>(params)[i] = p;
    reinterpret_cast<float4*>(m)[i] = mi;
    reinterpret_cast<float4*>(v)[i] = vi;
    if (params_bf16 != nullptr) {
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(params_bf16) + 2 * i;
      out[0] = __floats2bfloat162_rn(p.x, p.y);  // .x is the lower address
      out[1] = __floats2bfloat162_rn(p.z, p.w);
    }
  }
  for (int64_t i = n4 * 4 + tid; i < n; i += stride) {
    float p = params[i], mi = m[i], vi = v[i];
    AdamWUpdate(p, grads[i], mi, vi, c);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (params_bf16 != nullptr) params_bf16[i] = ToBf16(p);
  }
}

// ---- sum of squares ----------------------------------------------------------

// Each thread sums about this many elements before the block reduction.
constexpr int64_t kSquaresPerThread = 16;
// At most this many blocks (and per-block partials).
constexpr int64_t kMaxPartials = 1024;

__device__ __forceinline__ double WarpSumD(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// BlockSum (device_util.cuh) in double; every thread gets the result.
__device__ __forceinline__ double BlockSumD(double v, double* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = WarpSumD(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0;
  return WarpSumD(v);
}

// Sum of x^2 over this thread's share of a grid-stride loop (float4 loads
// when `vec`, i.e. x is 16-byte aligned); products are exact in double.
__device__ double ThreadSumSquares(const float* __restrict__ x, int64_t n, bool vec) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  int64_t start = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 q = reinterpret_cast<const float4*>(x)[i];
      acc += static_cast<double>(q.x) * q.x;
      acc += static_cast<double>(q.y) * q.y;
      acc += static_cast<double>(q.z) * q.z;
      acc += static_cast<double>(q.w) * q.w;
    }
    start = n4 * 4;
  }
  for (int64_t i = start + tid; i < n; i += stride) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

// partial[blockIdx.x] = this block's sum, or *out += it when partial is null
// (a single block).
__global__ void SumSquaresKernel(const float* __restrict__ x, int64_t n, bool vec, double* __restrict__ partial,
                                 double* __restrict__ out) {
  __shared__ double scratch[32];
  const double s = BlockSumD(ThreadSumSquares(x, n, vec), scratch);
  if (threadIdx.x == 0) {
    if (partial != nullptr) {
      partial[blockIdx.x] = s;
    } else {
      *out += s;
    }
  }
}

// *out += sum of partial[0..count), in a fixed order (one block).
__global__ void SumPartialsKernel(const double* __restrict__ partial, int64_t count, double* __restrict__ out) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = BlockSumD(s, scratch);
  if (threadIdx.x == 0) *out += s;
}

}  // namespace

absl::Status AdamWStep(float* params, bf16* params_bf16, const float* grads, float* m, float* v, int64_t n,
                       const AdamWParams& p, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("AdamWStep: n must be >= 0, got ", n));
  if (p.step < 1) return absl::InvalidArgumentError(absl::StrCat("AdamWStep: step must be >= 1, got ", p.step));
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamWStep: beta1 must be in [0, 1), got ", p.beta1));
  }
  if (!(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamWStep: beta2 must be in [0, 1), got ", p.beta2));
  }
  if (n == 0) return absl::OkStatus();
  if (params == nullptr) return absl::InvalidArgumentError("AdamWStep: params is null");
  if (grads == nullptr) return absl::InvalidArgumentError("AdamWStep: grads is null");
  if (m == nullptr) return absl::InvalidArgumentError("AdamWStep: m is null");
  if (v == nullptr) return absl::InvalidArgumentError("AdamWStep: v is null");

  const double beta1 = p.beta1, beta2 = p.beta2;
  const AdamWConsts c{p.lr,
                      p.beta1,
                      static_cast<float>(1.0 - beta1),
                      p.beta2,
                      static_cast<float>(1.0 - beta2),
                      p.eps,
                      p.weight_decay,
                      static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(p.step))),
                      static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(p.step))),
                      p.grad_scale};
  const bool vec = AlignedTo(params, 16) && AlignedTo(grads, 16) && AlignedTo(m, 16) && AlignedTo(v, 16) &&
                   (params_bf16 == nullptr || AlignedTo(params_bf16, 8));
  if (vec) {
    AdamWVectorKernel<<<GridFor((n + 3) / 4), kThreads, 0, stream>>>(params, params_bf16, grads, m, v, n, c);
  } else {
    AdamWScalarKernel<<<GridFor(n), kThreads, 0, stream>>>(params, params_bf16, grads, m, v, n, c);
  }
  return CudaStatus(cudaGetLastError(), "AdamWStep launch");
}

absl::Status SumOfSquares(const float* x, int64_t n, double* out, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("SumOfSquares: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("SumOfSquares: x is null");
  if (out == nullptr) return absl::InvalidArgumentError("SumOfSquares: out is null");
  if (!AlignedTo(out, alignof(double))) return absl::InvalidArgumentError("SumOfSquares: out is not 8-byte aligned");
  const bool vec = AlignedTo(x, 16);
  int64_t blocks = (n + kThreads * kSquaresPerThread - 1) / (kThreads * kSquaresPerThread);
  if (blocks > kMaxPartials) blocks = kMaxPartials;

  double* partial = nullptr;
  if (blocks > 1) {
    const cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&partial), blocks * sizeof(double), stream);
    if (err == cudaErrorNotSupported) {  // no stream-ordered allocator: one block does it all
      (void)cudaGetLastError();
      partial = nullptr;
      blocks = 1;
    } else if (err != cudaSuccess) {
      return CudaStatus(err, "SumOfSquares cudaMallocAsync");
    }
  }
  if (blocks == 1) {
    SumSquaresKernel<<<1, kThreads, 0, stream>>>(x, n, vec, nullptr, out);
    return CudaStatus(cudaGetLastError(), "SumOfSquares launch");
  }
  SumSquaresKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(x, n, vec, partial, nullptr);
  const absl::Status launched = CudaStatus(cudaGetLastError(), "SumOfSquares launch");
  if (launched.ok()) SumPartialsKernel<<<1, kThreads, 0, stream>>>(partial, blocks, out);
  const absl::Status finalized = CudaStatus(cudaGetLastError(), "SumOfSquares finalize launch");
  const absl::Status freed = CudaStatus(cudaFreeAsync(partial, stream), "SumOfSquares cudaFreeAsync");
  if (!launched.ok()) return launched;
  if (!finalized.ok()) return finalized;
  return freed;
}

}  // namespace dynapipe::runtime::cuda
