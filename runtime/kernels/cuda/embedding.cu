#include "runtime/kernels/cuda/embedding.h"

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

// One block per row i (grid-stride over rows), threads stride over C.
int RowGrid(int64_t N) { return static_cast<int>(N < 65535 * 16 ? N : 65535 * 16); }

__global__ void EmbeddingForwardKernel(bf16* out, const int32_t* tokens, const int32_t* positions, const bf16* wte,
                                       const bf16* wpe, int64_t N, int64_t C) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const bf16* e = wte + static_cast<int64_t>(tokens[i]) * C;
    bf16* o = out + i * C;
    if (wpe == nullptr) {  // no learned positions (T5): a copy
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = e[c];
      continue;
    }
    const bf16* p = wpe + static_cast<int64_t>(positions[i]) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = ToBf16(ToF32(e[c]) + ToF32(p[c]));
  }
}

// Several rows may carry the same token (or position): fp32 atomicAdd, whose
// order (and so the last bits of the sums) varies between runs.
__global__ void EmbeddingBackwardKernel(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                                        const int32_t* positions, int64_t N, int64_t C) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    float* e = dwte + static_cast<int64_t>(tokens[i]) * C;
    float* p = dwpe == nullptr ? nullptr : dwpe + static_cast<int64_t>(positions[i]) * C;
    const bf16* d = dout + i * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = ToF32(d[c]);
      atomicAdd(e + c, g);
      if (p != nullptr) atomicAdd(p + c, g);
    }
  }
}

absl::Status CheckSizes(const char* name, int64_t N, int64_t C) {
  if (N < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": N must be >= 0, got ", N));
  if (C < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": C must be >= 0, got ", C));
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(bf16* out, const int32_t* tokens, const int32_t* positions, const bf16* wte,
                              const bf16* wpe, int64_t N, int64_t C, cudaStream_t stream) {
  if (absl::Status s = CheckSizes("EmbeddingForward", N, C); !s.ok()) return s;
  if (N == 0 || C == 0) return absl::OkStatus();
  if (out == nullptr || tokens == nullptr || wte == nullptr || (wpe == nullptr) != (positions == nullptr)) {
    return absl::InvalidArgumentError("EmbeddingForward: null device pointer");
  }
  EmbeddingForwardKernel<<<RowGrid(N), kThreads, 0, stream>>>(out, tokens, positions, wte, wpe, N, C);
  return CudaStatus(cudaGetLastError(), "EmbeddingForward launch");
}

absl::Status EmbeddingBackward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                               const int32_t* positions, int64_t N, int64_t C, cudaStream_t stream) {
  if (absl::Status s = CheckSizes("EmbeddingBackward", N, C); !s.ok()) return s;
  if (N == 0 || C == 0) return absl::OkStatus();
  if (dwte == nullptr || dout == nullptr || tokens == nullptr || (dwpe == nullptr) != (positions == nullptr)) {
    return absl::InvalidArgumentError("EmbeddingBackward: null device pointer");
  }
  EmbeddingBackwardKernel<<<RowGrid(N), kThreads, 0, stream>>>(dwte, dwpe, dout, tokens, positions, N, C);
  return CudaStatus(cudaGetLastError(), "EmbeddingBackward launch");
}

}  // namespace dynapipe::runtime::cuda
