#include "runtime/kernels/cuda/cross_entropy.h"

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRowThreads = 512;   // one block per row; V ~ 50k gives ~100 elements a thread
constexpr int kSumThreads = 1024;  // the single block that sums the row losses

// One block per row (grid-stride over rows). The target, and so every branch
// below, is uniform over the block: the __syncthreads inside BlockMax and
// BlockSum are reached by all its threads.
__global__ void CrossEntropyRowKernel(float* row_loss, bf16* dlogits, const bf16* logits, const int32_t* targets,
                                      float scale, int64_t N, int64_t V) {
  __shared__ float scratch[kWarp];
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int64_t t = targets[i];
    if (t < 0) {  // not scored: no loss, no gradient
      if (threadIdx.x == 0) row_loss[i] = 0.0f;
      continue;
    }
    if (t >= V) {  // a bad target poisons the loss instead of reading past the row
      if (threadIdx.x == 0) row_loss[i] = NAN;
      continue;
    }
    const bf16* z = logits + i * V;
    // Online max and sum of exp(z - max) over this thread's elements.
    float m = -INFINITY, s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float x = ToF32(z[v]);
      if (x > m) {
        s = s * expf(m - x) + 1.0f;  // m = -inf: s is 0 and expf(-inf) is 0
        m = x;
      } else if (m > -INFINITY) {
        s += expf(x - m);
      }
    }
    const float row_max = BlockMax(m, scratch);
    const float row_sum = BlockSum(m > -INFINITY ? s * expf(m - row_max) : 0.0f, scratch);
    if (threadIdx.x == 0) row_loss[i] = scale * (row_max + logf(row_sum) - ToF32(z[t]));
    if (dlogits != nullptr) {
      const float inv_sum = 1.0f / row_sum;
      bf16* d = dlogits + i * V;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float p = expf(ToF32(z[v]) - row_max) * inv_sum;
        const float g = scale * (v == t ? p - 1.0f : p);
        d[v] = ToBf16(ToF32(d[v]) + g);
      }
    }
  }
}

// One block: a fixed assignment of rows to threads and a fixed reduction
// tree, so the sum is the same bits every run.
__global__ void SumRowLossKernel(float* loss_sum, const float* row_loss, int64_t N) {
  __shared__ float scratch[kWarp];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += row_loss[i];
  const float total = BlockSum(acc, scratch);
  if (threadIdx.x == 0) *loss_sum += total;
}

}  // namespace

absl::Status SoftmaxCrossEntropy(float* loss_sum, float* row_loss, bf16* dlogits, const bf16* logits,
                                 const int32_t* targets, float scale, int64_t N, int64_t V, cudaStream_t stream) {
  if (N < 0) return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: N must be >= 0, got ", N));
  if (V <= 0) return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: V must be > 0, got ", V));
  if (N == 0) return absl::OkStatus();
  if (loss_sum == nullptr || row_loss == nullptr || logits == nullptr || targets == nullptr) {
    return absl::InvalidArgumentError("SoftmaxCrossEntropy: null device pointer (only dlogits may be null)");
  }
  const int grid = static_cast<int>(N < 65535 * 16 ? N : 65535 * 16);
  CrossEntropyRowKernel<<<grid, kRowThreads, 0, stream>>>(row_loss, dlogits, logits, targets, scale, N, V);
  if (absl::Status s = CudaStatus(cudaGetLastError(), "SoftmaxCrossEntropy row launch"); !s.ok()) return s;
  SumRowLossKernel<<<1, kSumThreads, 0, stream>>>(loss_sum, row_loss, N);
  return CudaStatus(cudaGetLastError(), "SoftmaxCrossEntropy sum launch");
}

}  // namespace dynapipe::runtime::cuda
