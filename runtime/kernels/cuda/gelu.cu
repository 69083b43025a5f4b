#include "runtime/kernels/cuda/gelu.h"

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

// sqrt(2 / pi), as the CPU backend's std::sqrt(T(2) / T(M_PI)) rounded to fp32.
constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float Gelu(float x) { return 0.5f * x * (1.0f + tanhf(kGeluK * (x + kGeluC * x * x * x))); }

__global__ void GeluForwardKernel(bf16* out, const bf16* inp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = ToBf16(Gelu(ToF32(inp[i])));
  }
}

__device__ __forceinline__ float GeluGrad(float x) {
  const float th = tanhf(kGeluK * (x + kGeluC * x * x * x));
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

__global__ void GeluBackwardKernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dinp[i] = ToBf16(ToF32(dinp[i]) + GeluGrad(ToF32(inp[i])) * ToF32(dout[i]));
  }
}

__global__ void GeluBackwardInPlaceKernel(bf16* d, const bf16* inp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    d[i] = ToBf16(GeluGrad(ToF32(inp[i])) * ToF32(d[i]));
  }
}

__global__ void ReluForwardKernel(bf16* out, const bf16* inp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = ToBf16(fmaxf(ToF32(inp[i]), 0.0f));
  }
}

__global__ void ReluBackwardKernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (ToF32(inp[i]) > 0.0f) dinp[i] = ToBf16(ToF32(dinp[i]) + ToF32(dout[i]));
  }
}

// One thread per output element (row i, column f of F).
__global__ void GatedGeluForwardKernel(bf16* out, const bf16* inp, int64_t N, int64_t F) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * F;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / F, f = k % F;
    const bf16* row = inp + i * 2 * F;
    out[k] = ToBf16(Gelu(ToF32(row[f])) * ToF32(row[F + f]));
  }
}

__global__ void GatedGeluBackwardKernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * F;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / F, f = k % F;
    const float gate = ToF32(inp[i * 2 * F + f]), up = ToF32(inp[i * 2 * F + F + f]), g = ToF32(dout[k]);
    bf16* d = dinp + i * 2 * F;
    d[f] = ToBf16(ToF32(d[f]) + GeluGrad(gate) * up * g);
    d[F + f] = ToBf16(ToF32(d[F + f]) + Gelu(gate) * g);
  }
}

// sigmoid(x) as the CPU's 1 / (1 + exp(-x)) (SiLU likewise, x / (1 +
// exp(-x))): exp overflows to inf for x below about -88, giving 0, no NaN.
__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void SwigluForwardKernel(bf16* out, const bf16* inp, int64_t N, int64_t F) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * F;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / F, f = k % F;
    const bf16* row = inp + i * 2 * F;
    const float gate = ToF32(row[f]);
    out[k] = ToBf16(gate / (1.0f + expf(-gate)) * ToF32(row[F + f]));
  }
}

__global__ void SwigluBackwardKernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * F;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / F, f = k % F;
    const float gate = ToF32(inp[i * 2 * F + f]), up = ToF32(inp[i * 2 * F + F + f]), g = ToF32(dout[k]);
    const float s = Sigmoid(gate);
    bf16* d = dinp + i * 2 * F;
    d[f] = ToBf16(ToF32(d[f]) + s * (1.0f + gate * (1.0f - s)) * up * g);
    d[F + f] = ToBf16(ToF32(d[F + f]) + gate * s * g);
  }
}

}  // namespace

absl::Status GeluForward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("GeluForward: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (out == nullptr || inp == nullptr) return absl::InvalidArgumentError("GeluForward: null device pointer");
  GeluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(out, inp, n);
  return CudaStatus(cudaGetLastError(), "GeluForward launch");
}

absl::Status GeluBackward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("GeluBackward: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (dinp == nullptr || inp == nullptr || dout == nullptr) {
    return absl::InvalidArgumentError("GeluBackward: null device pointer");
  }
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dinp, inp, dout, n);
  return CudaStatus(cudaGetLastError(), "GeluBackward launch");
}

absl::Status GeluBackwardInPlace(bf16* d, const bf16* inp, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("GeluBackwardInPlace: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (d == nullptr || inp == nullptr) return absl::InvalidArgumentError("GeluBackwardInPlace: null device pointer");
  GeluBackwardInPlaceKernel<<<GridFor(n), kThreads, 0, stream>>>(d, inp, n);
  return CudaStatus(cudaGetLastError(), "GeluBackwardInPlace launch");
}

absl::Status ReluForward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ReluForward: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (out == nullptr || inp == nullptr) return absl::InvalidArgumentError("ReluForward: null device pointer");
  ReluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(out, inp, n);
  return CudaStatus(cudaGetLastError(), "ReluForward launch");
}

absl::Status ReluBackward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ReluBackward: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (dinp == nullptr || inp == nullptr || dout == nullptr) {
    return absl::InvalidArgumentError("ReluBackward: null device pointer");
  }
  ReluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dinp, inp, dout, n);
  return CudaStatus(cudaGetLastError(), "ReluBackward launch");
}

absl::Status GatedGeluForward(bf16* out, const bf16* inp, int64_t N, int64_t F, cudaStream_t stream) {
  if (N < 0 || F <= 0) return absl::InvalidArgumentError(absl::StrCat("GatedGeluForward: bad sizes ", N, " x ", F));
  if (N == 0) return absl::OkStatus();
  if (out == nullptr || inp == nullptr) return absl::InvalidArgumentError("GatedGeluForward: null device pointer");
  GatedGeluForwardKernel<<<GridFor(N * F), kThreads, 0, stream>>>(out, inp, N, F);
  return CudaStatus(cudaGetLastError(), "GatedGeluForward launch");
}

absl::Status GatedGeluBackward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F,
                               cudaStream_t stream) {
  if (N < 0 || F <= 0) return absl::InvalidArgumentError(absl::StrCat("GatedGeluBackward: bad sizes ", N, " x ", F));
  if (N == 0) return absl::OkStatus();
  if (dinp == nullptr || inp == nullptr || dout == nullptr) {
    return absl::InvalidArgumentError("GatedGeluBackward: null device pointer");
  }
  GatedGeluBackwardKernel<<<GridFor(N * F), kThreads, 0, stream>>>(dinp, inp, dout, N, F);
  return CudaStatus(cudaGetLastError(), "GatedGeluBackward launch");
}

absl::Status SwigluForward(bf16* out, const bf16* inp, int64_t N, int64_t F, cudaStream_t stream) {
  if (N < 0 || F <= 0) return absl::InvalidArgumentError(absl::StrCat("SwigluForward: bad sizes ", N, " x ", F));
  if (N == 0) return absl::OkStatus();
  if (out == nullptr || inp == nullptr) return absl::InvalidArgumentError("SwigluForward: null device pointer");
  SwigluForwardKernel<<<GridFor(N * F), kThreads, 0, stream>>>(out, inp, N, F);
  return CudaStatus(cudaGetLastError(), "SwigluForward launch");
}

absl::Status SwigluBackward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F,
                            cudaStream_t stream) {
  if (N < 0 || F <= 0) return absl::InvalidArgumentError(absl::StrCat("SwigluBackward: bad sizes ", N, " x ", F));
  if (N == 0) return absl::OkStatus();
  if (dinp == nullptr || inp == nullptr || dout == nullptr) {
    return absl::InvalidArgumentError("SwigluBackward: null device pointer");
  }
  SwigluBackwardKernel<<<GridFor(N * F), kThreads, 0, stream>>>(dinp, inp, dout, N, F);
  return CudaStatus(cudaGetLastError(), "SwigluBackward launch");
}

}  // namespace dynapipe::runtime::cuda
