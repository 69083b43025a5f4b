#include "runtime/kernels/cuda/qkv.h"

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"
#include "runtime/kernels/cuda/qkv_layout.h"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

// One thread per (token n, pair i): the angle depends on those alone, so its
// cos and sin serve every head of the row. Neighbouring threads take
// neighbouring i, so each head's reads and writes are contiguous.
__global__ void RotaryKernel(bf16* x, const int32_t* positions, int64_t N, int64_t stride, int64_t heads,
                             int64_t hs, double base, bool inverse) {
  const int64_t half = hs / 2;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * half;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = k / half, i = k - n * half;
    // As the CPU: position * base^(-2i / hs) in double, cos and sin rounded to fp32.
    const double angle =
        static_cast<double>(positions[n]) * pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
    double sin_d, cos_d;
    sincos(angle, &sin_d, &cos_d);
    const float co = static_cast<float>(cos_d), si = static_cast<float>(inverse ? -sin_d : sin_d);
    bf16* row = x + n * stride + i;
    for (int64_t h = 0; h < heads; ++h) {
      bf16* a = row + h * hs;
      bf16* b = a + half;
      const float u = ToF32(*a), w = ToF32(*b);
      *a = ToBf16(u * co - w * si);
      *b = ToBf16(w * co + u * si);
    }
  }
}

__global__ void ExpandKvKernel(bf16* out, const bf16* in, int64_t N, GroupedQkv g) {
  const int64_t W = g.Width(), E = g.ExpandedWidth();
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * E;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = k / E, j = k - n * E;
    out[k] = in[n * W + g.Source(j)];
  }
}

__global__ void ReduceKvKernel(bf16* out, const bf16* in, int64_t N, GroupedQkv g) {
  const int64_t W = g.Width(), E = g.ExpandedWidth();
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < N * W;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = k / W, j = k - n * W;
    const GroupedQkv::Sum src = g.Sources(j);
    const bf16* r = in + n * E + src.first;
    float sum = 0.0f;
    for (int64_t m = 0; m < src.count; ++m) sum += ToF32(r[m * src.step]);
    out[k] = ToBf16(sum);
  }
}

absl::Status CheckGroups(const char* name, int64_t N, int64_t C, int64_t heads, int64_t kv_heads) {
  if (N < 0 || C <= 0 || heads <= 0 || kv_heads <= 0 || C % heads != 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": bad sizes N ", N, ", C ", C, ", heads ", heads,
                                                   ", kv_heads ", kv_heads, " (heads must divide C, kv_heads heads)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RotaryApply(bf16* x, const int32_t* positions, int64_t N, int64_t stride, int64_t heads, int64_t hs,
                         double base, bool inverse, cudaStream_t stream) {
  if (N < 0 || heads <= 0 || hs <= 0 || hs % 2 != 0 || stride < heads * hs || !(base > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("RotaryApply: bad sizes N ", N, ", stride ", stride, ", heads ",
                                                   heads, ", head size ", hs, " (even), base ", base));
  }
  if (N == 0) return absl::OkStatus();
  if (x == nullptr || positions == nullptr) return absl::InvalidArgumentError("RotaryApply: null device pointer");
  RotaryKernel<<<GridFor(N * (hs / 2)), kThreads, 0, stream>>>(x, positions, N, stride, heads, hs, base, inverse);
  return CudaStatus(cudaGetLastError(), "RotaryApply launch");
}

absl::Status ExpandKvHeads(bf16* out, const bf16* in, int64_t N, int64_t C, int64_t heads, int64_t kv_heads,
                           cudaStream_t stream) {
  if (absl::Status s = CheckGroups("ExpandKvHeads", N, C, heads, kv_heads); !s.ok()) return s;
  if (N == 0) return absl::OkStatus();
  if (out == nullptr || in == nullptr) return absl::InvalidArgumentError("ExpandKvHeads: null device pointer");
  const GroupedQkv g{C, C / heads, heads, kv_heads};
  ExpandKvKernel<<<GridFor(N * g.ExpandedWidth()), kThreads, 0, stream>>>(out, in, N, g);
  return CudaStatus(cudaGetLastError(), "ExpandKvHeads launch");
}

absl::Status ReduceKvHeads(bf16* out, const bf16* in, int64_t N, int64_t C, int64_t heads, int64_t kv_heads,
                           cudaStream_t stream) {
  if (absl::Status s = CheckGroups("ReduceKvHeads", N, C, heads, kv_heads); !s.ok()) return s;
  if (N == 0) return absl::OkStatus();
  if (out == nullptr || in == nullptr) return absl::InvalidArgumentError("ReduceKvHeads: null device pointer");
  const GroupedQkv g{C, C / heads, heads, kv_heads};
  ReduceKvKernel<<<GridFor(N * g.Width()), kThreads, 0, stream>>>(out, in, N, g);
  return CudaStatus(cudaGetLastError(), "ReduceKvHeads launch");
}

}  // namespace dynapipe::runtime::cuda
