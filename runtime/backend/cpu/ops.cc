#include "runtime/backend/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace dynapipe::runtime::cpu {
namespace {

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC) {
  if (bias != nullptr) {
    for (int64_t i = 0; i < N; ++i) std::copy(bias, bias + OC, out + i * OC);
  }
  Gemm(CblasNoTrans, CblasTrans, N, OC, C, T(1), inp, C, weight, C, bias != nullptr ? T(1) : T(0), out, OC);
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int64_t C,
                    int64_t OC) {
  if (dinp != nullptr) Gemm(CblasNoTrans, CblasNoTrans, N, C, OC, T(1), dout, OC, weight, C, T(1), dinp, C);
  Gemm(CblasTrans, CblasNoTrans, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias != nullptr) {
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t o = 0; o < OC; ++o) dbias[o] += dout[i * OC + o];
    }
  }
}

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C) {
  const T eps = T(1e-5);
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= C;
    T v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const T s = T(1) / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                       const T* rstd, int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    const T* dy = dout + i * C;
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T norm = (x[c] - mean[i]) * rstd[i];
      const T dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int64_t c = 0; c < C; ++c) {
      const T norm = (x[c] - mean[i]) * rstd[i];
      const T dnorm = weight[c] * dy[c];
      dbias[c] += dy[c];
      dweight[c] += norm * dy[c];
      dinp[i * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
    }
  }
}

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  const T k = std::sqrt(T(2) / T(M_PI));
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T k = std::sqrt(T(2) / T(M_PI));
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = k * (x + T(0.044715) * x * x * x);
    const T th = std::tanh(u);
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * k * (T(1) + T(3) * T(0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
}

namespace {

// One query row of attention. Varlen computes only the pairs the query may
// see; materialized computes every causal pair and masks afterwards, so a
// padding query still costs a full row (its output is then discarded).
template <bool kMaterialized, typename T>
void AttendRow(T* o, T* a, const T* qkv, const int32_t* sg, int64_t b, int64_t i, int64_t h, int64_t Tn, int64_t C,
               int64_t hs, T scale) {
  const bool pad_query = sg[i] < 0;
  auto visible = [&](int64_t j) { return pad_query || sg[j] == sg[i]; };
  const T* q = qkv + (b * Tn + i) * 3 * C + h * hs;
  T mx = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    const bool keep = visible(j);
    if (!kMaterialized && !keep) continue;
    const T* k = qkv + (b * Tn + j) * 3 * C + C + h * hs;
    T dot = 0;
    for (int64_t d = 0; d < hs; ++d) dot += q[d] * k[d];
    a[j] = keep ? dot * scale : -INFINITY;
    mx = std::max(mx, a[j]);
  }
  T sum = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const bool keep = visible(j);
    if (!kMaterialized && !keep) continue;
    a[j] = keep ? std::exp(a[j] - mx) : T(0);
    sum += a[j];
  }
  for (int64_t j = 0; j <= i; ++j) {
    if (!kMaterialized && !visible(j)) continue;
    a[j] /= sum;
    const T* v = qkv + (b * Tn + j) * 3 * C + 2 * C + h * hs;
    for (int64_t d = 0; d < hs; ++d) o[d] += a[j] * v[d];
  }
  if (pad_query) {  // computed only to pay what a materialised kernel pays
    std::fill(o, o + hs, T(0));
    std::fill(a, a + i + 1, T(0));
  }
}

template <bool kMaterialized, typename T>
void AttentionForwardImpl(T* out, T* att, const T* qkv, const int32_t* seg, int64_t B, int64_t Tn, int64_t C,
                          int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(T(hs));
  std::fill(out, out + B * Tn * C, T(0));
  std::fill(att, att + B * NH * Tn * Tn, T(0));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* sg = seg + b * Tn;
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < Tn; ++i) {
        if (!kMaterialized && sg[i] < 0) continue;
        AttendRow<kMaterialized>(out + (b * Tn + i) * C + h * hs, att + ((b * NH + h) * Tn + i) * Tn, qkv, sg, b, i,
                                 h, Tn, C, hs, scale);
      }
    }
  }
}

// Masked pairs have probability exactly 0, so visiting them (materialized)
// adds exact zeros and leaves every gradient bit-identical to varlen.
template <bool kMaterialized, typename T>
void AttentionBackwardImpl(T* dqkv, const T* dout, const T* qkv, const T* att, const int32_t* seg, int64_t B,
                           int64_t Tn, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(T(hs));
  std::vector<T> datt(Tn);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* sg = seg + b * Tn;
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < Tn; ++i) {
        if (!kMaterialized && sg[i] < 0) continue;
        auto skip = [&](int64_t j) { return !kMaterialized && sg[j] != sg[i]; };
        const T* a = att + ((b * NH + h) * Tn + i) * Tn;
        const T* dy = dout + (b * Tn + i) * C + h * hs;
        // out_i = sum_j a_ij v_j
        T dot_sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          datt[j] = 0;
          if (skip(j)) continue;
          const T* v = qkv + (b * Tn + j) * 3 * C + 2 * C + h * hs;
          T* dv = dqkv + (b * Tn + j) * 3 * C + 2 * C + h * hs;
          for (int64_t d = 0; d < hs; ++d) {
            datt[j] += dy[d] * v[d];
            dv[d] += a[j] * dy[d];
          }
          dot_sum += a[j] * datt[j];
        }
        // softmax backward, then the scaled dot products
        const T* q = qkv + (b * Tn + i) * 3 * C + h * hs;
        T* dq = dqkv + (b * Tn + i) * 3 * C + h * hs;
        for (int64_t j = 0; j <= i; ++j) {
          if (skip(j)) continue;
          const T dpre = a[j] * (datt[j] - dot_sum) * scale;
          const T* k = qkv + (b * Tn + j) * 3 * C + C + h * hs;
          T* dk = dqkv + (b * Tn + j) * 3 * C + C + h * hs;
          for (int64_t d = 0; d < hs; ++d) {
            dq[d] += dpre * k[d];
            dk[d] += dpre * q[d];
          }
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, const int32_t* seg, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                      AttentionKernel kernel) {
  if (kernel == AttentionKernel::kMaterialized) {
    AttentionForwardImpl<true>(out, att, qkv, seg, B, Tn, C, NH);
  } else {
    AttentionForwardImpl<false>(out, att, qkv, seg, B, Tn, C, NH);
  }
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, const int32_t* seg, int64_t B, int64_t Tn,
                       int64_t C, int64_t NH, AttentionKernel kernel) {
  if (kernel == AttentionKernel::kMaterialized) {
    AttentionBackwardImpl<true>(dqkv, dout, qkv, att, seg, B, Tn, C, NH);
  } else {
    AttentionBackwardImpl<false>(dqkv, dout, qkv, att, seg, B, Tn, C, NH);
  }
}

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte, const T* wpe, int64_t N,
                      int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    const T* e = wte + static_cast<int64_t>(tokens[i]) * C;
    const T* p = wpe + static_cast<int64_t>(positions[i]) * C;
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = e[c] + p[c];
  }
}

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* positions, int64_t N,
                       int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    T* e = dwte + static_cast<int64_t>(tokens[i]) * C;
    T* p = dwpe + static_cast<int64_t>(positions[i]) * C;
    for (int64_t c = 0; c < C; ++c) {
      e[c] += dout[i * C + c];
      p[c] += dout[i * C + c];
    }
  }
}

template <typename T>
T CrossEntropyForward(T* probs, const T* logits, const int32_t* targets, T scale, int64_t N, int64_t V) {
  T loss = 0;
  for (int64_t i = 0; i < N; ++i) {
    const T* z = logits + i * V;
    T* p = probs + i * V;
    const T mx = *std::max_element(z, z + V);
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += (p[v] = std::exp(z[v] - mx));
    for (int64_t v = 0; v < V; ++v) p[v] /= sum;
    if (targets[i] >= 0) loss -= scale * (z[targets[i]] - mx - std::log(sum));
  }
  return loss;
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T scale, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    for (int64_t v = 0; v < V; ++v) dlogits[i * V + v] += scale * (probs[i * V + v] - (v == targets[i] ? T(1) : T(0)));
  }
}

#define DP_INSTANTIATE(T)                                                                                       \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                  \
  template void MatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);         \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t);                \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t,      \
                                     int64_t);                                                                  \
  template void GeluForward<T>(T*, const T*, int64_t);                                                          \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                                               \
  template void AttentionForward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,       \
                                    AttentionKernel);                                                           \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                     int64_t, AttentionKernel);                                                 \
  template void EmbeddingForward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int64_t, int64_t);  \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, const int32_t*, int64_t, int64_t);       \
  template T CrossEntropyForward<T>(T*, const T*, const int32_t*, T, int64_t, int64_t);                         \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, T, int64_t, int64_t);

DP_INSTANTIATE(float)
DP_INSTANTIATE(double)

}  // namespace dynapipe::runtime::cpu
