#include "runtime/kernels/cuda/elementwise.h"

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Grid-stride loops over flat element indices (int64: M * C may exceed 2^31).
__global__ void ResidualAddKernel(bf16* out, const bf16* a, const bf16* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = ToBf16(ToF32(a[i]) + ToF32(b[i]));
  }
}

__global__ void ScaleKernel(bf16* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = ToBf16(ToF32(x[i]) * s);
  }
}

__global__ void AddF32Kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void GatherRowsKernel(bf16* out, const bf16* in, const int32_t* rows, int64_t M, int64_t C) {
  const int64_t n = M * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    out[i] = in[static_cast<int64_t>(rows[r]) * C + c];
  }
}

__global__ void ScatterAddRowsKernel(bf16* out, const bf16* in, const int32_t* rows, int64_t M, int64_t C) {
  const int64_t n = M * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    bf16* o = out + static_cast<int64_t>(rows[r]) * C + c;
    *o = ToBf16(ToF32(*o) + ToF32(in[i]));
  }
}

absl::Status CheckRows(const char* name, int64_t M, int64_t C) {
  if (M < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": M must be >= 0, got ", M));
  if (C <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": C must be > 0, got ", C));
  return absl::OkStatus();
}

}  // namespace

absl::Status ResidualAdd(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ResidualAdd: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (out == nullptr || a == nullptr || b == nullptr) {
    return absl::InvalidArgumentError("ResidualAdd: null device pointer");
  }
  ResidualAddKernel<<<GridFor(n), kThreads, 0, stream>>>(out, a, b, n);
  return CudaStatus(cudaGetLastError(), "ResidualAdd launch");
}

absl::Status Scale(bf16* x, float s, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Scale: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("Scale: null device pointer");
  ScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(x, s, n);
  return CudaStatus(cudaGetLastError(), "Scale launch");
}

absl::Status AddF32(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("AddF32: n must be >= 0, got ", n));
  if (n == 0) return absl::OkStatus();
  if (out == nullptr || a == nullptr || b == nullptr) return absl::InvalidArgumentError("AddF32: null device pointer");
  AddF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(out, a, b, n);
  return CudaStatus(cudaGetLastError(), "AddF32 launch");
}

absl::Status GatherRows(bf16* out, const bf16* in, const int32_t* rows, int64_t M, int64_t C, cudaStream_t stream) {
  if (absl::Status s = CheckRows("GatherRows", M, C); !s.ok()) return s;
  if (M == 0) return absl::OkStatus();
  if (out == nullptr || in == nullptr || rows == nullptr) {
    return absl::InvalidArgumentError("GatherRows: null device pointer");
  }
  GatherRowsKernel<<<GridFor(M * C), kThreads, 0, stream>>>(out, in, rows, M, C);
  return CudaStatus(cudaGetLastError(), "GatherRows launch");
}

absl::Status ScatterAddRows(bf16* out, const bf16* in, const int32_t* rows, int64_t M, int64_t C,
                            cudaStream_t stream) {
  if (absl::Status s = CheckRows("ScatterAddRows", M, C); !s.ok()) return s;
  if (M == 0) return absl::OkStatus();
  if (out == nullptr || in == nullptr || rows == nullptr) {
    return absl::InvalidArgumentError("ScatterAddRows: null device pointer");
  }
  ScatterAddRowsKernel<<<GridFor(M * C), kThreads, 0, stream>>>(out, in, rows, M, C);
  return CudaStatus(cudaGetLastError(), "ScatterAddRows launch");
}

}  // namespace dynapipe::runtime::cuda
