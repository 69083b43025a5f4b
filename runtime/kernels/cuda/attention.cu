// Fused causal attention, FlashAttention-2 style, on bf16 WMMA tensor cores.
//
// Tiles of kAttentionTile (64) queries x 64 keys. Scores and products go
// through shared memory between the WMMA steps (fragments are only loaded,
// multiplied and stored, never indexed element-wise except for uniform
// scaling), so no fragment layout is assumed. Masking is per (query, key)
// pair; whole tile pairs are skipped with TilePairComputed (attention_tiles.h)
// on per-tile segment ranges every CTA computes from seg in its prologue.
// Masked pairs get probability exactly 0 and so add exact zeros: kVarlen and
// kMaterialized give identical bits.
//
// Forward: one CTA (4 warps) per (query tile, row x head); each warp owns 16
// query rows, each lane pair one row (online softmax state and the fp32
// output row in registers). Backward: a tiny kernel for D = rowsum(dO * O),
// then one CTA (8 warps) per key tile accumulating dK, dV over query tiles and
// one CTA per query tile accumulating dQ over key tiles (P and dP computed
// twice, but no atomics: deterministic, and every dqkv element is owned by one
// CTA, which adds its fp32 sum into the bf16 dqkv once).

#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/attention.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"

namespace dynapipe::runtime::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kTile = kAttentionTile;
constexpr int kFwdThreads = 128;  // 4 warps x 16 query rows
constexpr int kBwdThreads = 256;  // 8 warps: 4 blocks of 16 rows x 2 column halves
constexpr int64_t kMaxT = 65536;  // keeps the per-tile ranges in shared memory small
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory row strides (elements). Padded against bank conflicts; WMMA
// needs ldm % 8 == 0 for bf16 and % 4 for fp32, and 32-byte aligned fragment
// starts: rows are multiples of 16 and columns of 16 elements, bases 128-aligned.
template <int HS>
struct Ld {
  static constexpr int kB = HS + 8;                         // bf16 (64, HS) tiles
  static constexpr int kS = kTile + 4;                      // fp32 (64, 64) scores
  static constexpr int kP = kTile + 8;                      // bf16 (64, 64) probabilities
  static constexpr int kO = (HS > kTile ? HS : kTile) + 4;  // fp32 (64, max(HS, 64))
  static constexpr int kBwdF = 2 * kTile * kS > kTile* kO ? 2 * kTile* kS : kTile* kO;
};

__host__ __device__ constexpr size_t AlignUp(size_t bytes) { return (bytes + 127) / 128 * 128; }

struct SmemCarver {
  unsigned char* p;
  template <typename T>
  __device__ T* Take(int64_t n) {
    T* r = reinterpret_cast<T*>(p);
    p += AlignUp(static_cast<size_t>(n) * sizeof(T));
    return r;
  }
};

// Same order as the Take calls in AttnForwardKernel.
template <int HS>
constexpr size_t FwdSmemBytes(int nt) {
  using L = Ld<HS>;
  return 3 * AlignUp(kTile * L::kB * 2) + AlignUp(kTile * L::kO * 4) + AlignUp(kTile * L::kP * 2) +
         2 * AlignUp(kTile * 4) + AlignUp(nt * sizeof(TileSegRange));
}
// Same order as the Take calls in BwdSmem.
template <int HS>
constexpr size_t BwdSmemBytes(int nt) {
  using L = Ld<HS>;
  return 4 * AlignUp(kTile * L::kB * 2) + AlignUp(L::kBwdF * 4) + 2 * AlignUp(kTile * L::kP * 2) +
         4 * AlignUp(kTile * 4) + AlignUp(nt * sizeof(TileSegRange));
}

// c += A (16 x K, rows at a) * B^T where B (16 x K) has rows at b: both K-contiguous.
template <int K>
__device__ __forceinline__ void MmaABt(FragC& c, const bf16* a, int lda, const bf16* b, int ldb) {
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    FragA fa;
    FragBCol fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, b + k, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
}
// c += A (16 x K, rows at a) * B (K x 16, rows at b).
template <int K>
__device__ __forceinline__ void MmaAB(FragC& c, const bf16* a, int lda, const bf16* b, int ldb) {
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    FragA fa;
    FragBRow fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, b + static_cast<int64_t>(k) * ldb, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
}

// Segment range of each of the first n_tiles tiles of a row (one warp per
// tile); the same values AttentionTileWork computes on the host.
__device__ void TileRanges(TileSegRange* dst, const int32_t* seg_row, int T, int n_tiles) {
  const int lane = threadIdx.x % kWarp;
  for (int tile = threadIdx.x / kWarp; tile < n_tiles; tile += blockDim.x / kWarp) {
    TileSegRange r = EmptyTileSegRange();
    for (int i = lane; i < kTile; i += kWarp) {
      const int t = tile * kTile + i;
      if (t < T) r = ExtendTileSegRange(r, seg_row[t]);
    }
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const TileSegRange other{__shfl_xor_sync(0xffffffffu, r.lo, o), __shfl_xor_sync(0xffffffffu, r.hi, o)};
      r = MergeTileSegRanges(r, other);
    }
    if (lane == 0) dst[tile] = r;
  }
}

// dst (64, HS) = rows [t0, t0 + 64) of src (rows of `ld` elements) at column
// `col`; rows past T or of padding tokens are zeros (so garbage in padding
// can never reach a product). 16-byte vector loads.
template <int HS, int kN>
__device__ void LoadTile(bf16* dst, const bf16* src, int64_t ld, int64_t col, int t0, int T, const int32_t* seg_row) {
  constexpr int kChunks = HS / 8;
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kN) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8, t = t0 + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (t < T && seg_row[t] >= 0) v = *reinterpret_cast<const uint4*>(src + t * ld + col + c);
    *reinterpret_cast<uint4*>(dst + r * Ld<HS>::kB + c) = v;
  }
}

template <int kN>
__device__ void LoadSeg(int* dst, const int32_t* seg_row, int t0, int T) {
  for (int r = threadIdx.x; r < kTile; r += kN) dst[r] = t0 + r < T ? seg_row[t0 + r] : -1;
}

// ---------------------------------------------------------------- forward

template <int HS>
__global__ void __launch_bounds__(kFwdThreads)
    AttnForwardKernel(bf16* out, float* lse, const bf16* qkv, const int32_t* seg, int T, int C, int NH, int nt,
                      bool varlen, float scale_log2) {
  using L = Ld<HS>;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int qt = nt - 1 - static_cast<int>(blockIdx.y);  // the heaviest query tiles start first
  const int q0 = qt * kTile;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t ld = 3LL * C;
  const bf16* qkv_b = qkv + static_cast<int64_t>(b) * T * ld;
  const int32_t* seg_b = seg + static_cast<int64_t>(b) * T;

  extern __shared__ __align__(128) unsigned char attn_smem[];
  SmemCarver sm{attn_smem};
  bf16* sQ = sm.Take<bf16>(kTile * L::kB);
  bf16* sK = sm.Take<bf16>(kTile * L::kB);
  bf16* sV = sm.Take<bf16>(kTile * L::kB);
  float* sS = sm.Take<float>(kTile * L::kO);  // scores, then P V, of each warp's rows
  bf16* sP = sm.Take<bf16>(kTile * L::kP);
  int* sSegQ = sm.Take<int>(kTile);
  int* sSegK = sm.Take<int>(kTile);
  TileSegRange* sRange = sm.Take<TileSegRange>(nt);

  TileRanges(sRange, seg_b, T, qt + 1);
  LoadTile<HS, kFwdThreads>(sQ, qkv_b, ld, static_cast<int64_t>(h) * HS, q0, T, seg_b);
  LoadSeg<kFwdThreads>(sSegQ, seg_b, q0, T);
  __syncthreads();

  const int row = warp * 16 + lane / 2, half = lane % 2;  // a lane pair per query row
  const int tq = q0 + row;
  const int seg_q = sSegQ[row];
  const TileSegRange q_range = sRange[qt];
  float* sS_warp = sS + warp * 16 * L::kO;
  float m = -INFINITY, l = 0.0f;  // running max (log2 units) and sum of this row
  float o[HS / 2];                // this lane's half of the unnormalised output row
#pragma unroll
  for (int c = 0; c < HS / 2; ++c) o[c] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    if (!TilePairComputed(varlen, qt, kt, q_range, sRange[kt])) continue;  // uniform over the CTA
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous sK, sV, sSegK
    LoadTile<HS, kFwdThreads>(sK, qkv_b, ld, C + static_cast<int64_t>(h) * HS, k0, T, seg_b);
    LoadTile<HS, kFwdThreads>(sV, qkv_b, ld, 2LL * C + static_cast<int64_t>(h) * HS, k0, T, seg_b);
    LoadSeg<kFwdThreads>(sSegK, seg_b, k0, T);
    __syncthreads();

    // S (16 x 64) = Q_w K^T
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      FragC c;
      wmma::fill_fragment(c, 0.0f);
      MmaABt<HS>(c, sQ + warp * 16 * L::kB, L::kB, sK + n * 16 * L::kB, L::kB);
      wmma::store_matrix_sync(sS_warp + n * 16, c, L::kO, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this lane's 32 keys, combined with the partner lane.
    const float* srow = sS + row * L::kO + half * 32;
    const int* segk = sSegK + half * 32;
    const int j0 = k0 + half * 32;
    float mx = -INFINITY;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const bool keep = seg_q >= 0 && j0 + c <= tq && segk[c] == seg_q;
      if (keep) mx = fmaxf(mx, srow[c] * scale_log2);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float alpha = m_new == m ? 1.0f : exp2f(m - m_new);  // exactly 1 when nothing changed
    float sum = 0.0f;
    bf16* prow = sP + row * L::kP + half * 32;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const bool keep = seg_q >= 0 && j0 + c <= tq && segk[c] == seg_q;
      const float p = keep ? exp2f(srow[c] * scale_log2 - m_new) : 0.0f;
      sum += p;
      prow[c] = ToBf16(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();  // the warp's P rows are complete and its scores consumed

    // P_w V (16 x HS) into the warp's rows of sS, then o = o * alpha + P V.
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FragC c;
      wmma::fill_fragment(c, 0.0f);
      MmaAB<kTile>(c, sP + warp * 16 * L::kP, L::kP, sV + n * 16, L::kB);
      wmma::store_matrix_sync(sS_warp + n * 16, c, L::kO, wmma::mem_row_major);
    }
    __syncwarp();
    const float* pv = sS + row * L::kO + half * (HS / 2);
#pragma unroll
    for (int c = 0; c < HS / 2; ++c) o[c] = o[c] * alpha + pv[c];
    __syncwarp();
  }

  if (tq < T) {
    const bool valid = seg_q >= 0 && l > 0.0f;  // a real token always sees itself
    const float inv = valid ? 1.0f / l : 0.0f;
    bf16* orow = out + (static_cast<int64_t>(b) * T + tq) * C + static_cast<int64_t>(h) * HS + half * (HS / 2);
#pragma unroll
    for (int c = 0; c < HS / 2; ++c) orow[c] = ToBf16(valid ? o[c] * inv : 0.0f);
    if (half == 0) lse[(static_cast<int64_t>(b) * NH + h) * T + tq] = valid ? (m + log2f(l)) * kLn2 : 0.0f;
  }
}

// ---------------------------------------------------------------- backward

// D[b,h,t] = sum_d dO * O (0 for padding): one warp per (token, head).
template <int HS>
__global__ void AttnBwdDotKernel(float* D, const bf16* dout, const bf16* out, const int32_t* seg, int64_t n, int T,
                                 int C, int NH) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; w < n; w += stride) {
    const int h = static_cast<int>(w % NH);
    const int64_t bt = w / NH;  // b * T + t
    float acc = 0.0f;
    if (seg[bt] >= 0) {
      const int64_t base = bt * C + static_cast<int64_t>(h) * HS;
      for (int d = lane; d < HS; d += kWarp) acc += ToF32(dout[base + d]) * ToF32(out[base + d]);
    }
    acc = WarpSum(acc);
    if (lane == 0) D[(bt / T * NH + h) * T + bt % T] = acc;
  }
}

template <int HS>
struct BwdSmem {
  bf16 *sK, *sV, *sQ, *sdO;
  float* sF;  // scores sS and dP sdP side by side; later the fp32 (64, HS) result
  bf16 *sP, *sdS;
  int *sSegK, *sSegQ;
  float *sLse2, *sD;  // per query row: lse in log2 units, D
  TileSegRange* sRange;
  __device__ BwdSmem(unsigned char* base, int nt) {
    using L = Ld<HS>;
    SmemCarver sm{base};
    sK = sm.Take<bf16>(kTile * L::kB);
    sV = sm.Take<bf16>(kTile * L::kB);
    sQ = sm.Take<bf16>(kTile * L::kB);
    sdO = sm.Take<bf16>(kTile * L::kB);
    sF = sm.Take<float>(L::kBwdF);
    sP = sm.Take<bf16>(kTile * L::kP);
    sdS = sm.Take<bf16>(kTile * L::kP);
    sSegK = sm.Take<int>(kTile);
    sSegQ = sm.Take<int>(kTile);
    sLse2 = sm.Take<float>(kTile);
    sD = sm.Take<float>(kTile);
    sRange = sm.Take<TileSegRange>(nt);
  }
  __device__ float* sS() const { return sF; }
  __device__ float* sdP() const { return sF + kTile * Ld<HS>::kS; }
};

// Query-side tiles of query tile q0: Q, dO, seg, lse (log2 units), D.
template <int HS>
__device__ void LoadQuerySide(const BwdSmem<HS>& s, const bf16* qkv_b, const bf16* dout_b, const float* lse_bh,
                              const float* D_bh, const int32_t* seg_b, int q0, int T, int C, int h) {
  LoadTile<HS, kBwdThreads>(s.sQ, qkv_b, 3LL * C, static_cast<int64_t>(h) * HS, q0, T, seg_b);
  LoadTile<HS, kBwdThreads>(s.sdO, dout_b, C, static_cast<int64_t>(h) * HS, q0, T, seg_b);
  for (int r = threadIdx.x; r < kTile; r += kBwdThreads) {
    const int t = q0 + r;
    const int sg = t < T ? seg_b[t] : -1;
    s.sSegQ[r] = sg;
    s.sLse2[r] = sg >= 0 ? lse_bh[t] * kLog2e : 0.0f;
    s.sD[r] = sg >= 0 ? D_bh[t] : 0.0f;
  }
}

// dst[t, col + c] += bf16(src[r, c]) for the real tokens of the tile at t0.
template <int HS>
__device__ void AddTileInto(bf16* dst_b, int64_t ld, int64_t col, int t0, int T, const int* sSeg, const float* src) {
  for (int idx = threadIdx.x; idx < kTile * HS; idx += kBwdThreads) {
    const int r = idx / HS, c = idx % HS, t = t0 + r;
    if (t < T && sSeg[r] >= 0) {
      bf16* p = dst_b + t * ld + col + c;
      *p = ToBf16(ToF32(*p) + src[r * Ld<HS>::kO + c]);
    }
  }
}

// Scales the warp's (16, HS/2) accumulators by `scale` and stages them in sF.
template <int HS>
__device__ void StageResult(FragC (&acc)[HS / 32], float* sF, int rw, int cw, float scale) {
#pragma unroll
  for (int n = 0; n < HS / 32; ++n) {
#pragma unroll
    for (int i = 0; i < acc[n].num_elements; ++i) acc[n].x[i] *= scale;
    wmma::store_matrix_sync(sF + rw * 16 * Ld<HS>::kO + cw * (HS / 2) + n * 16, acc[n], Ld<HS>::kO,
                            wmma::mem_row_major);
  }
}

// One CTA per (key tile, row x head): dK, dV of its 64 keys over query tiles.
// Warp (rw, cw): key rows rw*16.., query columns cw*32.. of S^T and dP^T, and
// output columns cw*HS/2.. of dK, dV.
template <int HS>
__global__ void __launch_bounds__(kBwdThreads, 1)
    AttnBwdKVKernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D, const int32_t* seg,
                    int T, int C, int NH, int nt, bool varlen, float scale, float scale_log2) {
  using L = Ld<HS>;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kt = blockIdx.y, k0 = kt * kTile;  // low key tiles (the heaviest) start first
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, rw = warp % 4, cw = warp / 4;
  const int64_t ld = 3LL * C;
  const bf16* qkv_b = qkv + static_cast<int64_t>(b) * T * ld;
  const bf16* dout_b = dout + static_cast<int64_t>(b) * T * C;
  const int32_t* seg_b = seg + static_cast<int64_t>(b) * T;
  const int64_t bh = (static_cast<int64_t>(b) * NH + h) * T;
  extern __shared__ __align__(128) unsigned char attn_smem[];
  const BwdSmem<HS> s(attn_smem, nt);

  TileRanges(s.sRange, seg_b, T, nt);
  LoadTile<HS, kBwdThreads>(s.sK, qkv_b, ld, C + static_cast<int64_t>(h) * HS, k0, T, seg_b);
  LoadTile<HS, kBwdThreads>(s.sV, qkv_b, ld, 2LL * C + static_cast<int64_t>(h) * HS, k0, T, seg_b);
  LoadSeg<kBwdThreads>(s.sSegK, seg_b, k0, T);
  __syncthreads();
  const TileSegRange k_range = s.sRange[kt];
  FragC dK[HS / 32], dV[HS / 32];
#pragma unroll
  for (int n = 0; n < HS / 32; ++n) {
    wmma::fill_fragment(dK[n], 0.0f);
    wmma::fill_fragment(dV[n], 0.0f);
  }

  for (int qt = kt; qt < nt; ++qt) {
    if (!TilePairComputed(varlen, qt, kt, s.sRange[qt], k_range)) continue;  // uniform over the CTA
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous query-side tiles
    LoadQuerySide<HS>(s, qkv_b, dout_b, lse + bh, D + bh, seg_b, q0, T, C, h);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < 2; ++n) {  // S^T = K Q^T, dP^T = V dO^T
      const int col = cw * 32 + n * 16;
      FragC c;
      wmma::fill_fragment(c, 0.0f);
      MmaABt<HS>(c, s.sK + rw * 16 * L::kB, L::kB, s.sQ + col * L::kB, L::kB);
      wmma::store_matrix_sync(s.sS() + rw * 16 * L::kS + col, c, L::kS, wmma::mem_row_major);
      wmma::fill_fragment(c, 0.0f);
      MmaABt<HS>(c, s.sV + rw * 16 * L::kB, L::kB, s.sdO + col * L::kB, L::kB);
      wmma::store_matrix_sync(s.sdP() + rw * 16 * L::kS + col, c, L::kS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < 16 * 32; e += kWarp) {            // P^T and dS^T = P^T (dP^T - D) on the warp's block
      const int r = rw * 16 + e / 32, c = cw * 32 + e % 32;  // key r, query c
      const bool keep = s.sSegQ[c] >= 0 && k0 + r <= q0 + c && s.sSegK[r] == s.sSegQ[c];
      const float p = keep ? exp2f(s.sS()[r * L::kS + c] * scale_log2 - s.sLse2[c]) : 0.0f;
      s.sP[r * L::kP + c] = ToBf16(p);
      s.sdS[r * L::kP + c] = ToBf16(p * (s.sdP()[r * L::kS + c] - s.sD[c]));
    }
    __syncthreads();  // both column halves of P^T, dS^T are complete
#pragma unroll
    for (int n = 0; n < HS / 32; ++n) {  // dV += P^T dO, dK += dS^T Q
      const int col = cw * (HS / 2) + n * 16;
      MmaAB<kTile>(dV[n], s.sP + rw * 16 * L::kP, L::kP, s.sdO + col, L::kB);
      MmaAB<kTile>(dK[n], s.sdS + rw * 16 * L::kP, L::kP, s.sQ + col, L::kB);
    }
  }

  bf16* dqkv_b = dqkv + static_cast<int64_t>(b) * T * ld;
  __syncthreads();
  StageResult<HS>(dK, s.sF, rw, cw, scale);
  __syncthreads();
  AddTileInto<HS>(dqkv_b, ld, C + static_cast<int64_t>(h) * HS, k0, T, s.sSegK, s.sF);
  __syncthreads();
  StageResult<HS>(dV, s.sF, rw, cw, 1.0f);
  __syncthreads();
  AddTileInto<HS>(dqkv_b, ld, 2LL * C + static_cast<int64_t>(h) * HS, k0, T, s.sSegK, s.sF);
}

// One CTA per (query tile, row x head): dQ of its 64 queries over key tiles.
// Warp (rw, cw): query rows rw*16.., key columns cw*32.. of S and dP, output
// columns cw*HS/2.. of dQ.
template <int HS>
__global__ void __launch_bounds__(kBwdThreads, 1)
    AttnBwdQKernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D, const int32_t* seg,
                   int T, int C, int NH, int nt, bool varlen, float scale, float scale_log2) {
  using L = Ld<HS>;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int qt = nt - 1 - static_cast<int>(blockIdx.y), q0 = qt * kTile;  // heaviest first
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, rw = warp % 4, cw = warp / 4;
  const int64_t ld = 3LL * C;
  const bf16* qkv_b = qkv + static_cast<int64_t>(b) * T * ld;
  const int32_t* seg_b = seg + static_cast<int64_t>(b) * T;
  const int64_t bh = (static_cast<int64_t>(b) * NH + h) * T;
  extern __shared__ __align__(128) unsigned char attn_smem[];
  const BwdSmem<HS> s(attn_smem, nt);

  TileRanges(s.sRange, seg_b, T, qt + 1);
  LoadQuerySide<HS>(s, qkv_b, dout + static_cast<int64_t>(b) * T * C, lse + bh, D + bh, seg_b, q0, T, C, h);
  __syncthreads();
  const TileSegRange q_range = s.sRange[qt];
  FragC dQ[HS / 32];
#pragma unroll
  for (int n = 0; n < HS / 32; ++n) wmma::fill_fragment(dQ[n], 0.0f);

  for (int kt = 0; kt <= qt; ++kt) {
    if (!TilePairComputed(varlen, qt, kt, q_range, s.sRange[kt])) continue;  // uniform over the CTA
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous sK, sV, sdS
    LoadTile<HS, kBwdThreads>(s.sK, qkv_b, ld, C + static_cast<int64_t>(h) * HS, k0, T, seg_b);
    LoadTile<HS, kBwdThreads>(s.sV, qkv_b, ld, 2LL * C + static_cast<int64_t>(h) * HS, k0, T, seg_b);
    LoadSeg<kBwdThreads>(s.sSegK, seg_b, k0, T);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < 2; ++n) {  // S = Q K^T, dP = dO V^T
      const int col = cw * 32 + n * 16;
      FragC c;
      wmma::fill_fragment(c, 0.0f);
      MmaABt<HS>(c, s.sQ + rw * 16 * L::kB, L::kB, s.sK + col * L::kB, L::kB);
      wmma::store_matrix_sync(s.sS() + rw * 16 * L::kS + col, c, L::kS, wmma::mem_row_major);
      wmma::fill_fragment(c, 0.0f);
      MmaABt<HS>(c, s.sdO + rw * 16 * L::kB, L::kB, s.sV + col * L::kB, L::kB);
      wmma::store_matrix_sync(s.sdP() + rw * 16 * L::kS + col, c, L::kS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < 16 * 32; e += kWarp) {            // dS = P (dP - D) on the warp's block
      const int r = rw * 16 + e / 32, c = cw * 32 + e % 32;  // query r, key c
      const bool keep = s.sSegQ[r] >= 0 && k0 + c <= q0 + r && s.sSegK[c] == s.sSegQ[r];
      const float p = keep ? exp2f(s.sS()[r * L::kS + c] * scale_log2 - s.sLse2[r]) : 0.0f;
      s.sdS[r * L::kP + c] = ToBf16(p * (s.sdP()[r * L::kS + c] - s.sD[r]));
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < HS / 32; ++n) {  // dQ += dS K
      MmaAB<kTile>(dQ[n], s.sdS + rw * 16 * L::kP, L::kP, s.sK + cw * (HS / 2) + n * 16, L::kB);
    }
  }

  __syncthreads();
  StageResult<HS>(dQ, s.sF, rw, cw, scale);
  __syncthreads();
  AddTileInto<HS>(dqkv + static_cast<int64_t>(b) * T * ld, ld, static_cast<int64_t>(h) * HS, q0, T, s.sSegQ, s.sF);
}

// ---------------------------------------------------------------- launchers

absl::Status CheckShape(int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (B < 0) return absl::InvalidArgumentError(absl::StrCat("attention: B must be >= 0, got ", B));
  if (T < 0 || T > kMaxT) {
    return absl::InvalidArgumentError(absl::StrCat("attention: T must be in [0, ", kMaxT, "], got ", T));
  }
  if (NH <= 0) return absl::InvalidArgumentError(absl::StrCat("attention: NH must be > 0, got ", NH));
  if (C <= 0 || C % NH != 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention: C must be a positive multiple of NH=", NH, ", got ", C));
  }
  const int64_t hs = C / NH;
  if (hs != 32 && hs != 64 && hs != 128) {
    return absl::InvalidArgumentError(absl::StrCat("attention: head size hs = C / NH must be 32, 64 or 128, got ", hs));
  }
  if (B * NH > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("attention: B * NH too large: ", B * NH));
  return absl::OkStatus();
}

absl::Status CheckPointer(const void* p, const char* name) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat("attention: ", name, " is null"));
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention: ", name, " must be 16-byte aligned"));
  }
  return absl::OkStatus();
}

int Tiles(int64_t T) { return static_cast<int>((T + kTile - 1) / kTile); }

// Lets `kernel` use `bytes` of dynamic shared memory on the current device.
// The attribute is shared by every host thread, so it only ever grows (a
// thread asking for less must not shrink it under another's launch), under
// a mutex; FAILED_PRECONDITION when the device cannot give that much.
absl::Status AllowSharedMemory(const void* kernel, size_t bytes, const char* what) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> granted;
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  size_t& current = granted[{kernel, device}];
  if (bytes <= current) return absl::OkStatus();
  int limit = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<size_t>(limit)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": needs ", bytes, " bytes of shared memory per block, ",
                                                      "this device allows ", limit,
                                                      " (smaller head size or sequence length)"));
  }
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
  current = bytes;
  return absl::OkStatus();
}
float Scale(int64_t hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }  // as the CPU backend

template <int HS>
absl::Status LaunchForward(bf16* out, float* lse, const bf16* qkv, const int32_t* seg, int64_t B, int64_t T, int64_t C,
                           int64_t NH, bool varlen, cudaStream_t stream) {
  const int nt = Tiles(T);
  const size_t smem = FwdSmemBytes<HS>(nt);
  if (absl::Status st = AllowSharedMemory(reinterpret_cast<const void*>(&AttnForwardKernel<HS>), smem, "AttentionForward"); !st.ok()) return st;
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>(nt));
  AttnForwardKernel<HS><<<grid, kFwdThreads, smem, stream>>>(out, lse, qkv, seg, static_cast<int>(T),
                                                             static_cast<int>(C), static_cast<int>(NH), nt, varlen,
                                                             Scale(HS) * kLog2e);
  return CudaStatus(cudaGetLastError(), "AttentionForward launch");
}

template <int HS>
absl::Status LaunchBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                            const int32_t* seg, int64_t B, int64_t T, int64_t C, int64_t NH, bool varlen,
                            float* scratch, cudaStream_t stream) {
  const int nt = Tiles(T);
  const int64_t pairs = B * T * NH;
  AttnBwdDotKernel<HS><<<GridFor(pairs * kWarp), kThreads, 0, stream>>>(
      scratch, dout, out, seg, pairs, static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const size_t smem = BwdSmemBytes<HS>(nt);
  if (absl::Status st = AllowSharedMemory(reinterpret_cast<const void*>(&AttnBwdKVKernel<HS>), smem, "AttentionBackward"); !st.ok()) return st;
  if (absl::Status st = AllowSharedMemory(reinterpret_cast<const void*>(&AttnBwdQKernel<HS>), smem, "AttentionBackward"); !st.ok()) return st;
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>(nt));
  const float scale = Scale(HS), scale_log2 = scale * kLog2e;
  AttnBwdKVKernel<HS><<<grid, kBwdThreads, smem, stream>>>(dqkv, dout, qkv, lse, scratch, seg, static_cast<int>(T),
                                                           static_cast<int>(C), static_cast<int>(NH), nt, varlen, scale,
                                                           scale_log2);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  AttnBwdQKernel<HS><<<grid, kBwdThreads, smem, stream>>>(dqkv, dout, qkv, lse, scratch, seg, static_cast<int>(T),
                                                          static_cast<int>(C), static_cast<int>(NH), nt, varlen, scale,
                                                          scale_log2);
  return CudaStatus(cudaGetLastError(), "AttentionBackward launch");
}

}  // namespace

absl::Status AttentionForward(bf16* out, float* lse, const bf16* qkv, const int32_t* seg, int64_t B, int64_t T,
                              int64_t C, int64_t NH, AttentionMode mode, cudaStream_t stream) {
  if (absl::Status s = CheckShape(B, T, C, NH); !s.ok()) return s;
  if (B == 0 || T == 0) return absl::OkStatus();
  const std::pair<const void*, const char*> pointers[] = {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}, {seg, "seg"}};
  for (const auto& [p, name] : pointers) {
    if (absl::Status s = CheckPointer(p, name); !s.ok()) return s;
  }
  const bool varlen = mode == AttentionMode::kVarlen;
  switch (C / NH) {
    case 32:
      return LaunchForward<32>(out, lse, qkv, seg, B, T, C, NH, varlen, stream);
    case 64:
      return LaunchForward<64>(out, lse, qkv, seg, B, T, C, NH, varlen, stream);
    default:
      return LaunchForward<128>(out, lse, qkv, seg, B, T, C, NH, varlen, stream);
  }
}

int64_t AttentionBackwardScratchElements(int64_t B, int64_t T, int64_t /*C*/, int64_t NH) { return B * NH * T; }

absl::Status AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                               const int32_t* seg, int64_t B, int64_t T, int64_t C, int64_t NH, AttentionMode mode,
                               float* scratch, cudaStream_t stream) {
  if (absl::Status s = CheckShape(B, T, C, NH); !s.ok()) return s;
  if (B == 0 || T == 0) return absl::OkStatus();
  const std::pair<const void*, const char*> pointers[] = {
      {dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}, {lse, "lse"}, {seg, "seg"}, {scratch, "scratch"}};
  for (const auto& [p, name] : pointers) {
    if (absl::Status s = CheckPointer(p, name); !s.ok()) return s;
  }
  const bool varlen = mode == AttentionMode::kVarlen;
  switch (C / NH) {
    case 32:
      return LaunchBackward<32>(dqkv, dout, qkv, out, lse, seg, B, T, C, NH, varlen, scratch, stream);
    case 64:
      return LaunchBackward<64>(dqkv, dout, qkv, out, lse, seg, B, T, C, NH, varlen, scratch, stream);
    default:
      return LaunchBackward<128>(dqkv, dout, qkv, out, lse, seg, B, T, C, NH, varlen, scratch, stream);
  }
}

int64_t AttentionTileWork(const int32_t* seg_host, int64_t B, int64_t T, AttentionMode mode) {
  if (B <= 0 || T <= 0) return 0;
  const int64_t nt = (T + kTile - 1) / kTile;
  const bool varlen = mode == AttentionMode::kVarlen;
  std::vector<TileSegRange> ranges(nt);
  int64_t work = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t tile = 0; tile < nt; ++tile) {
      TileSegRange r = EmptyTileSegRange();
      for (int64_t t = tile * kTile; t < T && t < (tile + 1) * kTile; ++t)
        r = ExtendTileSegRange(r, seg_host[b * T + t]);
      ranges[tile] = r;
    }
    for (int64_t qt = 0; qt < nt; ++qt) {
      for (int64_t kt = 0; kt <= qt; ++kt) work += TilePairComputed(varlen, qt, kt, ranges[qt], ranges[kt]);
    }
  }
  return work;
}

}  // namespace dynapipe::runtime::cuda
