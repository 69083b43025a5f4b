// T5's attention on CUDA cores (t5_attention.h). One warp per (token, head);
// lanes split the keys (forward, dq) or queries (dk, dv) 32 at a time: each
// lane takes one pair's dot products against the warp's own row, kept in
// shared memory as fp32, then the warp adds the 32 pairs' contributions to
// its fp32 accumulators, each lane holding hs / 32 columns. Warps never
// synchronise with each other, so a warp whose item lies past the end simply
// returns.

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"
#include "runtime/kernels/cuda/t5_attention.h"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;  // warps per block
constexpr unsigned kFull = 0xffffffffu;

// The (token, head) a warp works on, over (B * T) tokens.
struct Item {
  int64_t n = 0;  // token, b * T + t
  int64_t b = 0, t = 0;
  int h = 0;
};

__device__ __forceinline__ bool WarpItem(int64_t B, int64_t T, int64_t NH, Item* it) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (w >= B * T * NH) return false;
  it->h = static_cast<int>(w % NH);
  it->n = w / NH;
  it->b = it->n / T;
  it->t = it->n % T;
  return true;
}

// dst[0, HS) = src as fp32 (the warp's lanes), visible to the whole warp.
template <int HS>
__device__ __forceinline__ void LoadRow(float* dst, const bf16* src) {
  for (int c = threadIdx.x % kWarp; c < HS; c += kWarp) dst[c] = ToF32(src[c]);
  __syncwarp();
}

// sum_c a[c] * row[c]: `a` in shared memory (every lane reads the same
// element: a broadcast), `row` a 16-byte aligned bf16 row in global memory.
template <int HS>
__device__ __forceinline__ float Dot(const float* a, const bf16* row) {
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < HS; c += 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(row + c);
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(p[e]);
      acc = fmaf(a[c + 2 * e], f.x, acc);
      acc = fmaf(a[c + 2 * e + 1], f.y, acc);
    }
  }
  return acc;
}

__device__ __forceinline__ float Bias(const T5AttentionArgs& a, int64_t i, int64_t j, int h) {
  if (a.bias == nullptr) return 0.0f;
  return ToF32(a.bias[static_cast<int64_t>(a.bucket_of[j - i + a.Tq - 1]) * a.NH + h]);
}

__device__ __forceinline__ bool Visible(const T5AttentionArgs& a, int32_t seg_q, int64_t i, int64_t b, int64_t j) {
  return a.seg_k[b * a.Tk + j] == seg_q && (!a.causal || j <= i);
}

// ---------------------------------------------------------------- forward

template <int HS>
__global__ void __launch_bounds__(kWarps* kWarp) T5ForwardKernel(T5AttentionArgs a, bf16* out, float* lse) {
  constexpr int R = HS / kWarp;
  __shared__ float s_q[kWarps][HS];
  Item it;
  if (!WarpItem(a.B, a.Tq, a.NH, &it)) return;
  const int lane = threadIdx.x % kWarp;
  float* q = s_q[threadIdx.x / kWarp];
  const int32_t seg = a.seg_q[it.n];
  const int lo = a.key_ranges[2 * it.n], hi = a.key_ranges[2 * it.n + 1];
  const int64_t kbase = it.b * a.Tk;
  float m = -INFINITY, sum = 0.0f, o[R];
#pragma unroll
  for (int r = 0; r < R; ++r) o[r] = 0.0f;
  if (seg >= 0 && lo < hi) {
    LoadRow<HS>(q, a.q + it.n * a.ldq + it.h * HS);
    for (int j0 = lo; j0 < hi; j0 += kWarp) {
      const int j = j0 + lane;
      float s = -INFINITY;
      if (j < hi && Visible(a, seg, it.t, it.b, j)) {
        s = a.scale * Dot<HS>(q, a.k + (kbase + j) * a.ldkv + it.h * HS) + Bias(a, it.t, j, it.h);
      }
      const float chunk_max = WarpMax(s);
      if (chunk_max == -INFINITY) continue;  // uniform: nothing visible here
      const float m_new = fmaxf(m, chunk_max);
      const float corr = expf(m - m_new);  // 0 while m is -inf
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      sum = sum * corr + WarpSum(p);
#pragma unroll
      for (int r = 0; r < R; ++r) o[r] *= corr;
      const int keys = min(kWarp, hi - j0);
      for (int u = 0; u < keys; ++u) {
        const float pu = __shfl_sync(kFull, p, u);
        if (pu == 0.0f) continue;  // uniform: the value is the warp's
        const bf16* vr = a.v + (kbase + j0 + u) * a.ldkv + it.h * HS;
#pragma unroll
        for (int r = 0; r < R; ++r) o[r] = fmaf(pu, ToF32(vr[lane + r * kWarp]), o[r]);
      }
      m = m_new;
    }
  }
  const bool any = sum > 0.0f;
  const float inv = any ? 1.0f / sum : 0.0f;
  bf16* orow = out + it.n * a.C + it.h * HS;
#pragma unroll
  for (int r = 0; r < R; ++r) orow[lane + r * kWarp] = ToBf16(o[r] * inv);
  if (lane == 0) lse[it.n * a.NH + it.h] = any ? m + logf(sum) : 0.0f;
}

// ---------------------------------------------------------------- backward

// Per query: D = rowsum(dO * O) into dsum (kept for the key pass), then
// dq += scale * sum_j dS_ij k_j with dS = P (dP - D), dP = dO . v_j.
template <int HS>
__global__ void __launch_bounds__(kWarps* kWarp)
    T5BackwardQueryKernel(T5AttentionArgs a, const bf16* out, const float* lse, const bf16* dout, bf16* dq,
                          float* dsum) {
  constexpr int R = HS / kWarp;
  __shared__ float s_q[kWarps][HS], s_do[kWarps][HS];
  Item it;
  if (!WarpItem(a.B, a.Tq, a.NH, &it)) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const bf16* orow = out + it.n * a.C + it.h * HS;
  const bf16* dorow = dout + it.n * a.C + it.h * HS;
  float d = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) d = fmaf(ToF32(dorow[lane + r * kWarp]), ToF32(orow[lane + r * kWarp]), d);
  d = WarpSum(d);
  if (lane == 0) dsum[it.n * a.NH + it.h] = d;
  const int32_t seg = a.seg_q[it.n];
  const int lo = a.key_ranges[2 * it.n], hi = a.key_ranges[2 * it.n + 1];
  if (seg < 0 || lo >= hi) return;
  float* q = s_q[warp];
  float* dov = s_do[warp];
  LoadRow<HS>(q, a.q + it.n * a.ldq + it.h * HS);
  LoadRow<HS>(dov, dorow);
  const float L = lse[it.n * a.NH + it.h];
  const int64_t kbase = it.b * a.Tk;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int j0 = lo; j0 < hi; j0 += kWarp) {
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j < hi && Visible(a, seg, it.t, it.b, j)) {
      const int64_t kv = (kbase + j) * a.ldkv + it.h * HS;
      const float p = expf(a.scale * Dot<HS>(q, a.k + kv) + Bias(a, it.t, j, it.h) - L);
      ds = p * (Dot<HS>(dov, a.v + kv) - d);
    }
    const int keys = min(kWarp, hi - j0);
    for (int u = 0; u < keys; ++u) {
      const float du = __shfl_sync(kFull, ds, u);
      if (du == 0.0f) continue;
      const bf16* kr = a.k + (kbase + j0 + u) * a.ldkv + it.h * HS;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(du, ToF32(kr[lane + r * kWarp]), acc[r]);
    }
  }
  bf16* dqrow = dq + it.n * a.ldq + it.h * HS;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int c = lane + r * kWarp;
    dqrow[c] = ToBf16(ToF32(dqrow[c]) + a.scale * acc[r]);
  }
}

// Per key: dk += scale * sum_i dS_ij q_i, dv += sum_i P_ij dO_i, and the
// bias table's gradient (sum of dS per bucket) through shared memory.
template <int HS>
__global__ void __launch_bounds__(kWarps* kWarp)
    T5BackwardKeyKernel(T5AttentionArgs a, const float* lse, const bf16* dout, const float* dsum, bf16* dk,
                        bf16* dv, float* dbias) {
  constexpr int R = HS / kWarp;
  extern __shared__ float t5_smem[];
  Item it;
  if (!WarpItem(a.B, a.Tk, a.NH, &it)) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int32_t seg = a.seg_k[it.n];
  const int lo = a.query_ranges[2 * it.n], hi = a.query_ranges[2 * it.n + 1];
  if (seg < 0 || lo >= hi) return;
  const int nb = dbias != nullptr ? a.buckets : 0;
  float* kf = t5_smem + static_cast<int64_t>(warp) * (2 * HS + nb);
  float* vf = kf + HS;
  float* db = vf + HS;
  const int64_t kv = it.n * a.ldkv + it.h * HS;
  LoadRow<HS>(kf, a.k + kv);
  LoadRow<HS>(vf, a.v + kv);
  for (int c = lane; c < nb; c += kWarp) db[c] = 0.0f;
  __syncwarp();
  const int64_t j = it.t, qbase = it.b * a.Tq;
  float dk_acc[R], dv_acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) dk_acc[r] = dv_acc[r] = 0.0f;
  for (int i0 = lo; i0 < hi; i0 += kWarp) {
    const int i = i0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (i < hi && a.seg_q[qbase + i] == seg && (!a.causal || j <= i)) {
      const int64_t qi = qbase + i;
      const float b = Bias(a, i, j, it.h);
      p = expf(a.scale * Dot<HS>(kf, a.q + qi * a.ldq + it.h * HS) + b - lse[qi * a.NH + it.h]);
      ds = p * (Dot<HS>(vf, dout + qi * a.C + it.h * HS) - dsum[qi * a.NH + it.h]);
      if (nb > 0) atomicAdd(db + a.bucket_of[j - i + a.Tq - 1], ds);
    }
    const int queries = min(kWarp, hi - i0);
    for (int u = 0; u < queries; ++u) {
      const float pu = __shfl_sync(kFull, p, u), du = __shfl_sync(kFull, ds, u);
      if (pu == 0.0f && du == 0.0f) continue;
      const int64_t qi = qbase + i0 + u;
      const bf16* qr = a.q + qi * a.ldq + it.h * HS;
      const bf16* dor = dout + qi * a.C + it.h * HS;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        dk_acc[r] = fmaf(du, ToF32(qr[lane + r * kWarp]), dk_acc[r]);
        dv_acc[r] = fmaf(pu, ToF32(dor[lane + r * kWarp]), dv_acc[r]);
      }
    }
  }
  bf16* dkrow = dk + kv;
  bf16* dvrow = dv + kv;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int c = lane + r * kWarp;
    dkrow[c] = ToBf16(ToF32(dkrow[c]) + a.scale * dk_acc[r]);
    dvrow[c] = ToBf16(ToF32(dvrow[c]) + dv_acc[r]);
  }
  __syncwarp();
  for (int c = lane; c < nb; c += kWarp) {
    if (db[c] != 0.0f) atomicAdd(dbias + static_cast<int64_t>(c) * a.NH + it.h, db[c]);
  }
}

// ---------------------------------------------------------------- launchers

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status Check(const T5AttentionArgs& a, int* hs) {
  if (a.B < 0 || a.Tq < 0 || a.Tk < 0 || a.NH <= 0 || a.C <= 0 || a.C % a.NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 attention: bad shape B=", a.B, " Tq=", a.Tq, " Tk=", a.Tk, " C=", a.C, " NH=", a.NH));
  }
  *hs = static_cast<int>(a.C / a.NH);
  if (*hs != 32 && *hs != 64 && *hs != 128) {
    return absl::InvalidArgumentError(absl::StrCat("T5 attention: head size ", *hs, " is not 32, 64 or 128"));
  }
  if (a.causal && a.Tq != a.Tk) return absl::InvalidArgumentError("T5 attention: causal needs Tq == Tk");
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.seg_q == nullptr || a.seg_k == nullptr ||
      a.key_ranges == nullptr || a.query_ranges == nullptr) {
    return absl::InvalidArgumentError("T5 attention: null device pointer");
  }
  if (!Aligned16(a.q) || !Aligned16(a.k) || !Aligned16(a.v) || a.ldq % 8 != 0 || a.ldkv % 8 != 0) {
    return absl::InvalidArgumentError("T5 attention: q, k and v rows must be 16-byte aligned");
  }
  if (a.bias != nullptr && (a.bucket_of == nullptr || a.buckets <= 0 || a.buckets > kMaxT5Buckets)) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 attention: a bias needs its bucket table and 1..", kMaxT5Buckets, " buckets"));
  }
  if (a.B * std::max(a.Tq, a.Tk) * a.NH > static_cast<int64_t>(INT32_MAX) * kWarps) {
    return absl::InvalidArgumentError("T5 attention: too many (token, head) pairs for one launch");
  }
  return absl::OkStatus();
}

int Blocks(int64_t items) { return static_cast<int>((items + kWarps - 1) / kWarps); }

template <int HS>
absl::Status Forward(const T5AttentionArgs& a, bf16* out, float* lse, cudaStream_t stream) {
  T5ForwardKernel<HS><<<Blocks(a.B * a.Tq * a.NH), kWarps * kWarp, 0, stream>>>(a, out, lse);
  return CudaStatus(cudaGetLastError(), "T5AttentionForward launch");
}

template <int HS>
absl::Status Backward(const T5AttentionArgs& a, const bf16* out, const float* lse, const bf16* dout, bf16* dq,
                      bf16* dk, bf16* dv, float* dbias, float* scratch, cudaStream_t stream) {
  T5BackwardQueryKernel<HS><<<Blocks(a.B * a.Tq * a.NH), kWarps * kWarp, 0, stream>>>(a, out, lse, dout, dq, scratch);
  if (absl::Status s = CudaStatus(cudaGetLastError(), "T5AttentionBackward (queries) launch"); !s.ok()) return s;
  const int nb = dbias != nullptr ? a.buckets : 0;
  const size_t smem = static_cast<size_t>(kWarps) * (2 * HS + nb) * sizeof(float);
  T5BackwardKeyKernel<HS>
      <<<Blocks(a.B * a.Tk * a.NH), kWarps * kWarp, smem, stream>>>(a, lse, dout, scratch, dk, dv, dbias);
  return CudaStatus(cudaGetLastError(), "T5AttentionBackward (keys) launch");
}

}  // namespace

absl::Status T5AttentionForward(const T5AttentionArgs& a, bf16* out, float* lse, cudaStream_t stream) {
  int hs = 0;
  if (absl::Status s = Check(a, &hs); !s.ok()) return s;
  if (a.B * a.Tq == 0) return absl::OkStatus();
  if (out == nullptr || lse == nullptr) return absl::InvalidArgumentError("T5AttentionForward: null output");
  switch (hs) {
    case 32: return Forward<32>(a, out, lse, stream);
    case 64: return Forward<64>(a, out, lse, stream);
    default: return Forward<128>(a, out, lse, stream);
  }
}

absl::Status T5AttentionBackward(const T5AttentionArgs& a, const bf16* out, const float* lse, const bf16* dout,
                                 bf16* dq, bf16* dk, bf16* dv, float* dbias, float* scratch, cudaStream_t stream) {
  int hs = 0;
  if (absl::Status s = Check(a, &hs); !s.ok()) return s;
  if (a.B * a.Tq == 0 || a.Tk == 0) return absl::OkStatus();
  if (out == nullptr || lse == nullptr || dout == nullptr || dq == nullptr || dk == nullptr || dv == nullptr ||
      scratch == nullptr) {
    return absl::InvalidArgumentError("T5AttentionBackward: null device pointer");
  }
  if (!Aligned16(dout)) return absl::InvalidArgumentError("T5AttentionBackward: dout must be 16-byte aligned");
  if (dbias != nullptr && a.bias == nullptr) {
    return absl::InvalidArgumentError("T5AttentionBackward: a bias gradient without a bias");
  }
  switch (hs) {
    case 32: return Backward<32>(a, out, lse, dout, dq, dk, dv, dbias, scratch, stream);
    case 64: return Backward<64>(a, out, lse, dout, dq, dk, dv, dbias, scratch, stream);
    default: return Backward<128>(a, out, lse, dout, dq, dk, dv, dbias, scratch, stream);
  }
}

}  // namespace dynapipe::runtime::cuda
