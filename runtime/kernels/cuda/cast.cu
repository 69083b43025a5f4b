#include <cuda_bf16.h>

#include "runtime/kernels/cuda/cast.h"
#include "runtime/device/cuda_status.h"
#include "src/common/keyed_normal.h"

namespace dynapipe::runtime::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride beyond
}

__global__ void FillF32Kernel(float* out, float value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

__global__ void FillKeyedNormalKernel(float* out, uint64_t key, float std, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = keyed_normal::Normal(key, static_cast<uint64_t>(i), std);
  }
}

__global__ void CastF32ToBf16Kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 b = __float2bfloat16_rn(in[i]);
    out[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

__global__ void CastBf16ToF32Kernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
  }
}

}  // namespace

absl::Status FillF32(float* out, float value, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  FillF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(out, value, n);
  return CudaStatus(cudaGetLastError(), "FillF32 launch");
}

absl::Status FillKeyedNormal(float* out, uint64_t key, float std, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  FillKeyedNormalKernel<<<Blocks(n), kThreads, 0, stream>>>(out, key, std, n);
  return CudaStatus(cudaGetLastError(), "FillKeyedNormal launch");
}

absl::Status CastF32ToBf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  CastF32ToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(in, out, n);
  return CudaStatus(cudaGetLastError(), "CastF32ToBf16 launch");
}

absl::Status CastBf16ToF32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  CastBf16ToF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(in, out, n);
  return CudaStatus(cudaGetLastError(), "CastBf16ToF32 launch");
}

}  // namespace dynapipe::runtime::cuda
