// Segment-masked causal attention on BLAS blocks (see ops.h), and T5's
// cross-attention (at the end).
//
// The tokens of a row split into spans that attend among themselves: with
// the varlen kernel, each sample (a maximal run of one segment id) is a span
// and padding belongs to none; with the materialized kernel, the whole row
// is one span whose pairs across samples are computed and then masked. Per
// span and head, queries go in blocks of kBlock rows; a block's scores
// against every key up to its last query are one GEMM (S = scale Q K^T), the
// causal softmax runs row by row in SIMD lanes, and the output is a second
// GEMM (O = P V). Only the upper triangle inside a diagonal block is wasted
// work. Probabilities are kept per span and head as an L x L matrix (row
// stride L), so varlen keeps sum(L^2) per head instead of T^2 per row.
//
// Backward replays the same blocks: dP = dO V^T, the softmax backward
// dS = P (dP - rowsum(P dP)) scale, then dQ += dS K, dK += dS^T Q and
// dV += P^T dO, all GEMMs accumulating into dqkv.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cpu/gemm.h"
#include "runtime/kernels/cpu/vec_math.h"

namespace dynapipe::runtime::cpu {
namespace {

constexpr int64_t kBlock = 64;

struct Span {
  int64_t row = 0, start = 0, len = 0;
  bool masked = false;  // pairs across segments (and padding queries) are computed, then masked
  int64_t probs = 0;    // offset of this span's NH x L x L probabilities
};

// Varlen spans are the maximal runs of one segment id >= 0. A row where an
// id comes back after another (not produced by our batching, but allowed by
// the contract) becomes one masked span, which the mask keeps exact.
std::vector<Span> Spans(const int32_t* seg, int64_t B, int64_t Tn, int64_t NH, AttentionKernel kernel) {
  std::vector<Span> spans;
  int64_t probs = 0;
  auto add = [&](int64_t row, int64_t start, int64_t len, bool masked) {
    spans.push_back(Span{row, start, len, masked, probs});
    probs += NH * len * len;
  };
  std::vector<int32_t> seen;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* sg = seg + b * Tn;
    const size_t first = spans.size();
    const int64_t probs_before = probs;
    bool whole_row = kernel == AttentionKernel::kMaterialized;
    seen.clear();
    for (int64_t t = 0; t < Tn && !whole_row;) {
      int64_t e = t + 1;
      while (e < Tn && sg[e] == sg[t]) ++e;
      if (sg[t] >= 0) {
        if (std::find(seen.begin(), seen.end(), sg[t]) != seen.end()) {
          whole_row = true;
          break;
        }
        seen.push_back(sg[t]);
        add(b, t, e - t, false);
      }
      t = e;
    }
    if (whole_row) {
      spans.resize(first);
      probs = probs_before;
      add(b, 0, Tn, true);
    }
  }
  return spans;
}

// In place over a[0, n): a = softmax(a). Masked entries are -inf on entry;
// at least one entry is finite.
DP_SIMD_CLONES void SoftmaxRow(float* a, int64_t n) {
  using namespace simd;
  VF vmax = Splat(-__builtin_huge_valf());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF v = Load(a + j);
    vmax = SelectLess(vmax, v, v, vmax);
  }
  float mx = HorizontalMax(vmax);
  for (int64_t k = j; k < n; ++k) mx = std::max(mx, a[k]);
  VF vsum = Splat(0.0f);
  j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF e = Exp(Load(a + j) - mx);
    Store(a + j, e);
    vsum += e;
  }
  float sum = HorizontalSum(vsum);
  if (j < n) {
    float buf[kLanes];
    std::fill(buf, buf + kLanes, -__builtin_huge_valf());
    std::copy(a + j, a + n, buf);
    const VF e = Exp(Load(buf) - mx);  // padded lanes: exp(-inf) = 0
    Store(buf, e);
    std::copy(buf, buf + (n - j), a + j);
    sum += HorizontalSum(e);
  }
  const float inv = 1.0f / sum;
  Map(a, a, n, [inv](VF v) { return v * inv; });
}
void SoftmaxRow(double* a, int64_t n) {
  const double mx = *std::max_element(a, a + n);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (a[j] = std::exp(a[j] - mx));
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < n; ++j) a[j] *= inv;
}

// ds[0, n) = p * (dp - sum(p * dp)) * scale, in place over dp.
DP_SIMD_CLONES void SoftmaxBackwardRow(const float* p, float* dp, int64_t n, float scale) {
  using namespace simd;
  VF vdot = Splat(0.0f);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) vdot += Load(p + j) * Load(dp + j);
  float dot = HorizontalSum(vdot);
  for (int64_t k = j; k < n; ++k) dot += p[k] * dp[k];
  for (j = 0; j + kLanes <= n; j += kLanes) Store(dp + j, Load(p + j) * (Load(dp + j) - dot) * scale);
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - dot) * scale;
}
void SoftmaxBackwardRow(const double* p, double* dp, int64_t n, double scale) {
  double dot = 0;
  for (int64_t j = 0; j < n; ++j) dot += p[j] * dp[j];
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - dot) * scale;
}

// Keys a query row r of a block ending at q1 sees: [0, r] causal, the
// whole span otherwise.
int64_t KeysOf(int64_t r, int64_t L, bool causal) { return causal ? r + 1 : L; }

// Query rows [q0, q1) of one span and head: scores from S (row stride L,
// already scaled and biased) to probabilities over each row's keys (KeysOf;
// a causal block's later keys up to q1 zeroed).
template <typename T>
void BlockSoftmax(T* P, const Span& s, const int32_t* sg, int64_t q0, int64_t q1, bool causal) {
  const int64_t L = s.len;
  for (int64_t r = q0; r < q1; ++r) {
    T* a = P + r * L;
    const int64_t n = KeysOf(r, L, causal);
    if (causal) std::fill(a + r + 1, a + q1, T(0));  // future keys of this block
    if (s.masked) {
      const int32_t own = sg[s.start + r];
      if (own < 0) {  // a padding query: computed above, then discarded
        std::fill(a, a + n, T(0));
        continue;
      }
      for (int64_t j = 0; j < n; ++j) {
        if (sg[s.start + j] != own) a[j] = -INFINITY;
      }
    }
    SoftmaxRow(a, n);
  }
}

// The bias table's entry index (bucket * NH) of each key distance j - r,
// for distances -(L - 1) .. L - 1 (index L - 1 + j - r).
template <typename T>
std::vector<int> BucketRows(int64_t L, int64_t NH, const AttentionOptions<T>& o) {
  std::vector<int> rows(static_cast<size_t>(2 * L - 1));
  for (int64_t d = -(L - 1); d <= L - 1; ++d) {
    rows[d + L - 1] = RelativePositionBucket(static_cast<int>(d), !o.causal, o.buckets, o.max_distance) *
                      static_cast<int>(NH);
  }
  return rows;
}

}  // namespace

int RelativePositionBucket(int relative, bool bidirectional, int buckets, int max_distance) {
  int bucket = 0;
  int n = relative;
  if (bidirectional) {
    buckets /= 2;
    if (n > 0) bucket += buckets;
    n = std::abs(n);
  } else {
    n = std::max(-n, 0);  // keys before the query; later ones share bucket 0
  }
  const int exact = buckets / 2;
  if (n < exact) return bucket + n;
  // As T5: log(n / exact) in float over log(max_distance / exact) taken in
  // double and rounded to float, truncated toward zero, capped at the last
  // bucket.
  const float range = static_cast<float>(std::log(static_cast<double>(max_distance) / exact));
  const float scaled = std::log(static_cast<float>(n) / static_cast<float>(exact)) / range *
                       static_cast<float>(buckets - exact);
  return bucket + std::min(exact + static_cast<int>(scaled), buckets - 1);
}

namespace {

// Where a head's queries, keys and values sit in a row of [q | k | v]: NH
// query heads, then kv heads of keys and of values (kv_heads 0: NH), query
// head h reading kv head h / (NH / kv heads).
struct QkvRow {
  QkvRow(int64_t C, int64_t NH, int64_t kv_heads)
      : hs(C / NH), kvh(kv_heads > 0 ? kv_heads : NH), group(NH / kvh), C(C), width(C + 2 * kvh * hs) {}
  int64_t Key(int64_t h) const { return C + (h / group) * hs; }
  int64_t Value(int64_t h) const { return C + kvh * hs + (h / group) * hs; }
  int64_t hs, kvh, group, C, width;
};

}  // namespace

int64_t AttentionProbsSize(const int32_t* seg, int64_t B, int64_t Tn, int64_t NH, AttentionKernel kernel) {
  const std::vector<Span> spans = Spans(seg, B, Tn, NH, kernel);
  return spans.empty() ? 0 : spans.back().probs + NH * spans.back().len * spans.back().len;
}

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, const int32_t* seg, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                      AttentionKernel kernel, const AttentionOptions<T>& opt) {
  const int64_t hs = C / NH;
  const T scale = opt.scaled ? T(1) / std::sqrt(T(hs)) : T(1);
  // Tokens outside every span (varlen padding) output zeros.
  for (int64_t t = 0; t < B * Tn; ++t) {
    if (seg[t] < 0) std::fill(out + t * C, out + (t + 1) * C, T(0));
  }
  const QkvRow row(C, NH, opt.kv_heads);
  const int64_t W = row.width;
  for (const Span& s : Spans(seg, B, Tn, NH, kernel)) {
    const int32_t* sg = seg + s.row * Tn;
    const int64_t L = s.len, tok0 = s.row * Tn + s.start;
    const std::vector<int> bucket_rows = opt.bias != nullptr ? BucketRows(L, NH, opt) : std::vector<int>{};
    for (int64_t h = 0; h < NH; ++h) {
      T* P = att + s.probs + h * L * L;
      const T* q = qkv + tok0 * W + h * hs;
      const T* k = qkv + tok0 * W + row.Key(h);
      const T* v = qkv + tok0 * W + row.Value(h);
      T* o = out + tok0 * C + h * hs;
      for (int64_t q0 = 0; q0 < L; q0 += kBlock) {
        const int64_t q1 = std::min(L, q0 + kBlock), m = q1 - q0, keys = opt.causal ? q1 : L;
        Gemm(CblasNoTrans, CblasTrans, m, keys, hs, scale, q + q0 * W, W, k, W, T(0), P + q0 * L, L);
        for (int64_t r = q0; r < q1 && opt.bias != nullptr; ++r) {
          T* a = P + r * L;
          const int* row = bucket_rows.data() + (L - 1 - r);  // row[j]: distance j - r
          for (int64_t j = 0; j < KeysOf(r, L, opt.causal); ++j) a[j] += opt.bias[row[j] + h];
        }
        BlockSoftmax(P, s, sg, q0, q1, opt.causal);
        Gemm(CblasNoTrans, CblasNoTrans, m, hs, keys, T(1), P + q0 * L, L, v, W, T(0), o + q0 * C, C);
      }
      if (s.masked) {  // padding queries: zero probabilities gave zero outputs; make them exact zeros
        for (int64_t r = 0; r < L; ++r) {
          if (sg[s.start + r] < 0) std::fill(o + r * C, o + r * C + hs, T(0));
        }
      }
    }
  }
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, const int32_t* seg, int64_t B, int64_t Tn,
                       int64_t C, int64_t NH, AttentionKernel kernel, const AttentionOptions<T>& opt, T* dbias) {
  const int64_t hs = C / NH;
  const T scale = opt.scaled ? T(1) / std::sqrt(T(hs)) : T(1);
  const bool bias = opt.bias != nullptr && dbias != nullptr;
  std::vector<T> dp(static_cast<size_t>(kBlock * Tn));
  const QkvRow row(C, NH, opt.kv_heads);
  const int64_t W = row.width;
  for (const Span& s : Spans(seg, B, Tn, NH, kernel)) {
    const int64_t L = s.len, tok0 = s.row * Tn + s.start;
    const std::vector<int> bucket_rows = bias ? BucketRows(L, NH, opt) : std::vector<int>{};
    // Query heads sharing a key-value head add into its gradient in turn.
    for (int64_t h = 0; h < NH; ++h) {
      const T* P = att + s.probs + h * L * L;
      const T* q = qkv + tok0 * W + h * hs;
      const T* k = qkv + tok0 * W + row.Key(h);
      const T* v = qkv + tok0 * W + row.Value(h);
      T* dq = dqkv + tok0 * W + h * hs;
      T* dk = dqkv + tok0 * W + row.Key(h);
      T* dv = dqkv + tok0 * W + row.Value(h);
      const T* dy = dout + tok0 * C + h * hs;
      for (int64_t q0 = 0; q0 < L; q0 += kBlock) {
        const int64_t q1 = std::min(L, q0 + kBlock), m = q1 - q0, keys = opt.causal ? q1 : L;
        T* d = dp.data();  // (m, keys)
        Gemm(CblasNoTrans, CblasTrans, m, keys, hs, T(1), dy + q0 * C, C, v, W, T(0), d, keys);
        for (int64_t r = q0; r < q1; ++r) {
          T* dr = d + (r - q0) * keys;
          const int64_t n = KeysOf(r, L, opt.causal);
          // The bias gets the score gradient before the scale (it is added after it).
          SoftmaxBackwardRow(P + r * L, dr, n, bias ? T(1) : scale);
          if (bias) {
            const int* row = bucket_rows.data() + (L - 1 - r);
            for (int64_t j = 0; j < n; ++j) dbias[row[j] + h] += dr[j];
            if (scale != T(1)) {
              for (int64_t j = 0; j < n; ++j) dr[j] *= scale;
            }
          }
          std::fill(dr + n, dr + keys, T(0));
        }
        Gemm(CblasNoTrans, CblasNoTrans, m, hs, keys, T(1), d, keys, k, W, T(1), dq + q0 * W, W);
        Gemm(CblasTrans, CblasNoTrans, keys, hs, m, T(1), d, keys, q + q0 * W, W, T(1), dk, W);
        Gemm(CblasTrans, CblasNoTrans, keys, hs, m, T(1), P + q0 * L, L, dy + q0 * C, C, T(1), dv, W);
      }
    }
  }
}

namespace {

// One sample's queries [q0, q0 + lq) and keys [k0, k0 + lk) in row b, and
// where its lq x lk probabilities per head start.
struct CrossSpan {
  int64_t row = 0, q0 = 0, lq = 0, k0 = 0, lk = 0, probs = 0;
};

// The maximal run of `id` in sg[0, n), as [start, start + len); len 0 if absent.
std::pair<int64_t, int64_t> RunOf(const int32_t* sg, int64_t n, int32_t id) {
  int64_t start = 0;
  while (start < n && sg[start] != id) ++start;
  int64_t end = start;
  while (end < n && sg[end] == id) ++end;
  return {start, end - start};
}

std::vector<CrossSpan> CrossSpans(const int32_t* seg_q, const int32_t* seg_k, int64_t B, int64_t Tq, int64_t Tk,
                                  int64_t NH) {
  std::vector<CrossSpan> spans;
  int64_t probs = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* sq = seg_q + b * Tq;
    for (int64_t t = 0; t < Tq;) {
      int64_t e = t + 1;
      while (e < Tq && sq[e] == sq[t]) ++e;
      if (sq[t] >= 0) {
        const auto [k0, lk] = RunOf(seg_k + b * Tk, Tk, sq[t]);
        if (lk > 0) {
          spans.push_back(CrossSpan{b, t, e - t, k0, lk, probs});
          probs += NH * (e - t) * lk;
        }
      }
      t = e;
    }
  }
  return spans;
}

}  // namespace

int64_t CrossAttentionProbsSize(const int32_t* seg_q, const int32_t* seg_k, int64_t B, int64_t Tq, int64_t Tk,
                                int64_t NH) {
  const std::vector<CrossSpan> spans = CrossSpans(seg_q, seg_k, B, Tq, Tk, NH);
  return spans.empty() ? 0 : spans.back().probs + NH * spans.back().lq * spans.back().lk;
}

template <typename T>
void CrossAttentionForward(T* out, T* att, const T* q, const T* kv, const int32_t* seg_q, const int32_t* seg_k,
                           int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, bool scaled) {
  const int64_t hs = C / NH;
  const T scale = scaled ? T(1) / std::sqrt(T(hs)) : T(1);
  std::fill(out, out + B * Tq * C, T(0));  // queries without keys (padding included) output zeros
  for (const CrossSpan& s : CrossSpans(seg_q, seg_k, B, Tq, Tk, NH)) {
    const int64_t qtok = s.row * Tq + s.q0, ktok = s.row * Tk + s.k0;
    for (int64_t h = 0; h < NH; ++h) {
      T* P = att + s.probs + h * s.lq * s.lk;
      const T* qh = q + qtok * C + h * hs;
      const T* k = kv + ktok * 2 * C + h * hs;
      const T* v = k + C;
      Gemm(CblasNoTrans, CblasTrans, s.lq, s.lk, hs, scale, qh, C, k, 2 * C, T(0), P, s.lk);
      for (int64_t r = 0; r < s.lq; ++r) SoftmaxRow(P + r * s.lk, s.lk);
      Gemm(CblasNoTrans, CblasNoTrans, s.lq, hs, s.lk, T(1), P, s.lk, v, 2 * C, T(0), out + qtok * C + h * hs, C);
    }
  }
}

template <typename T>
void CrossAttentionBackward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* att, const int32_t* seg_q,
                            const int32_t* seg_k, int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH,
                            bool scaled) {
  const int64_t hs = C / NH;
  const T scale = scaled ? T(1) / std::sqrt(T(hs)) : T(1);
  std::vector<T> d;
  for (const CrossSpan& s : CrossSpans(seg_q, seg_k, B, Tq, Tk, NH)) {
    const int64_t qtok = s.row * Tq + s.q0, ktok = s.row * Tk + s.k0;
    d.resize(static_cast<size_t>(s.lq * s.lk));
    for (int64_t h = 0; h < NH; ++h) {
      const T* P = att + s.probs + h * s.lq * s.lk;
      const T* qh = q + qtok * C + h * hs;
      const T* k = kv + ktok * 2 * C + h * hs;
      const T* v = k + C;
      const T* dy = dout + qtok * C + h * hs;
      T* dqh = dq + qtok * C + h * hs;
      T* dk = dkv + ktok * 2 * C + h * hs;
      T* dv = dk + C;
      Gemm(CblasNoTrans, CblasTrans, s.lq, s.lk, hs, T(1), dy, C, v, 2 * C, T(0), d.data(), s.lk);
      for (int64_t r = 0; r < s.lq; ++r) SoftmaxBackwardRow(P + r * s.lk, d.data() + r * s.lk, s.lk, scale);
      Gemm(CblasNoTrans, CblasNoTrans, s.lq, hs, s.lk, T(1), d.data(), s.lk, k, 2 * C, T(1), dqh, C);
      Gemm(CblasTrans, CblasNoTrans, s.lk, hs, s.lq, T(1), d.data(), s.lk, qh, C, T(1), dk, 2 * C);
      Gemm(CblasTrans, CblasNoTrans, s.lk, hs, s.lq, T(1), P, s.lk, dy, C, T(1), dv, 2 * C);
    }
  }
}

#define DP_INSTANTIATE_ATTENTION(T)                                                                               \
  template void AttentionForward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,         \
                                    AttentionKernel, const AttentionOptions<T>&);                                 \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                     int64_t, AttentionKernel, const AttentionOptions<T>&, T*);                    \
  template void CrossAttentionForward<T>(T*, T*, const T*, const T*, const int32_t*, const int32_t*, int64_t,     \
                                         int64_t, int64_t, int64_t, int64_t, bool);                               \
  template void CrossAttentionBackward<T>(T*, T*, const T*, const T*, const T*, const T*, const int32_t*,         \
                                          const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, bool);

DP_INSTANTIATE_ATTENTION(float)
DP_INSTANTIATE_ATTENTION(double)

}  // namespace dynapipe::runtime::cpu
