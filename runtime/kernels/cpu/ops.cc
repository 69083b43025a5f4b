#include "runtime/kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/kernels/cpu/gemm.h"
#include "runtime/kernels/cpu/vec_math.h"

namespace dynapipe::runtime::cpu {

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

namespace {

// Row reductions and elementwise passes of LayerNorm and GELU. The float
// versions run in SIMD lanes (several partial sums, so a different order
// of additions than the double ones, which the tests check them against).
DP_SIMD_CLONES void LayerNormRowsF(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                   const float* bias, int64_t N, int64_t C, float eps) {
  using namespace simd;
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    VF vs = Splat(0.0f);
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes) vs += Load(x + c);
    float m = HorizontalSum(vs);
    for (int64_t k = c; k < C; ++k) m += x[k];
    m /= C;
    VF vv = Splat(0.0f);
    for (c = 0; c + kLanes <= C; c += kLanes) {
      const VF d = Load(x + c) - m;
      vv += d * d;
    }
    float v = HorizontalSum(vv);
    for (int64_t k = c; k < C; ++k) v += (x[k] - m) * (x[k] - m);
    v /= C;
    const float s = 1.0f / std::sqrt(v + eps);
    float* y = out + i * C;
    if (bias != nullptr) {
      for (c = 0; c + kLanes <= C; c += kLanes) Store(y + c, (Load(x + c) - m) * s * Load(weight + c) + Load(bias + c));
      for (int64_t k = c; k < C; ++k) y[k] = (x[k] - m) * s * weight[k] + bias[k];
    } else {
      for (c = 0; c + kLanes <= C; c += kLanes) Store(y + c, (Load(x + c) - m) * s * Load(weight + c));
      for (int64_t k = c; k < C; ++k) y[k] = (x[k] - m) * s * weight[k];
    }
    mean[i] = m;
    rstd[i] = s;
  }
}

DP_SIMD_CLONES void LayerNormBackwardRowsF(float* dinp, float* dweight, float* dbias, const float* dout,
                                           const float* inp, const float* weight, const float* mean,
                                           const float* rstd, int64_t N, int64_t C) {
  using namespace simd;
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    const float* dy = dout + i * C;
    float* dx = dinp + i * C;
    const float m = mean[i], s = rstd[i];
    VF va = Splat(0.0f), vb = Splat(0.0f);
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes) {
      const VF norm = (Load(x + c) - m) * s;
      const VF dnorm = Load(weight + c) * Load(dy + c);
      va += dnorm;
      vb += dnorm * norm;
    }
    float dnorm_mean = HorizontalSum(va), dnorm_norm_mean = HorizontalSum(vb);
    for (int64_t k = c; k < C; ++k) {
      const float norm = (x[k] - m) * s, dnorm = weight[k] * dy[k];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (c = 0; c + kLanes <= C; c += kLanes) {
      const VF norm = (Load(x + c) - m) * s;
      const VF g = Load(dy + c);
      const VF dnorm = Load(weight + c) * g;
      if (dbias != nullptr) Store(dbias + c, Load(dbias + c) + g);
      Store(dweight + c, Load(dweight + c) + norm * g);
      Store(dx + c, Load(dx + c) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
    for (int64_t k = c; k < C; ++k) {
      const float norm = (x[k] - m) * s, dnorm = weight[k] * dy[k];
      if (dbias != nullptr) dbias[k] += dy[k];
      dweight[k] += norm * dy[k];
      dx[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluC = 0.044715;

DP_SIMD_CLONES void GeluForwardF(float* out, const float* inp, int64_t n) {
  using namespace simd;
  const float k2 = static_cast<float>(-2 * kGeluK), c = static_cast<float>(kGeluC);
  Map(out, inp, n, [=](VF x) { return x / (1.0f + Exp(k2 * (x + c * x * x * x))); });
}

DP_SIMD_CLONES void GeluBackwardF(float* dinp, const float* inp, const float* dout, int64_t n) {
  using namespace simd;
  const float k = static_cast<float>(kGeluK), c = static_cast<float>(kGeluC), c3 = static_cast<float>(3 * kGeluC);
  auto grad = [=](VF x) {
    // s = sigmoid(2u) = (1 + tanh(u)) / 2 and 1 - s = e s, without cancellation.
    const VF e = Exp(-2.0f * k * (x + c * x * x * x));
    const VF s = 1.0f / (1.0f + e);
    return s + 2.0f * x * s * (e * s) * k * (1.0f + c3 * x * x);
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(dinp + i, Load(dinp + i) + grad(Load(inp + i)) * Load(dout + i));
  if (i < n) {
    float g[kLanes] = {};
    std::memcpy(g, inp + i, (n - i) * sizeof(float));
    Store(g, grad(Load(g)));
    for (int64_t j = i; j < n; ++j) dinp[j] += g[j - i] * dout[j];
  }
}

}  // namespace

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                      double eps_in) {
  if constexpr (std::is_same_v<T, float>) {
    LayerNormRowsF(out, mean, rstd, inp, weight, bias, N, C, static_cast<float>(eps_in));
  } else {
    const T eps = T(eps_in);
    for (int64_t i = 0; i < N; ++i) {
      const T* x = inp + i * C;
      T m = 0;
      for (int64_t c = 0; c < C; ++c) m += x[c];
      m /= C;
      T v = 0;
      for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
      v /= C;
      const T s = T(1) / std::sqrt(v + eps);
      for (int64_t c = 0; c < C; ++c) out[i * C + c] = (x[c] - m) * s * weight[c] + (bias != nullptr ? bias[c] : T(0));
      mean[i] = m;
      rstd[i] = s;
    }
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                       const T* rstd, int64_t N, int64_t C) {
  if constexpr (std::is_same_v<T, float>) {
    LayerNormBackwardRowsF(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  } else {
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
        if (dbias != nullptr) dbias[c] += dy[c];
        dweight[c] += norm * dy[c];
        dinp[i * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
      }
    }
  }
}

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    GeluForwardF(out, inp, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T x = inp[i];
      out[i] = x / (T(1) + std::exp(T(-2 * kGeluK) * (x + T(kGeluC) * x * x * x)));
    }
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    GeluBackwardF(dinp, inp, dout, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T x = inp[i];
      const T e = std::exp(T(-2 * kGeluK) * (x + T(kGeluC) * x * x * x));
      const T s = T(1) / (T(1) + e);
      dinp[i] += (s + T(2) * x * s * (e * s) * T(kGeluK) * (T(1) + T(3 * kGeluC) * x * x)) * dout[i];
    }
  }
}

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte, const T* wpe, int64_t N,
                      int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    const T* e = wte + static_cast<int64_t>(tokens[i]) * C;
    if (wpe == nullptr) {
      std::copy(e, e + C, out + i * C);
      continue;
    }
    const T* p = wpe + static_cast<int64_t>(positions[i]) * C;
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = e[c] + p[c];
  }
}

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* positions, int64_t N,
                       int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    T* e = dwte + static_cast<int64_t>(tokens[i]) * C;
    for (int64_t c = 0; c < C; ++c) e[c] += dout[i * C + c];
    if (dwpe == nullptr) continue;
    T* p = dwpe + static_cast<int64_t>(positions[i]) * C;
    for (int64_t c = 0; c < C; ++c) p[c] += dout[i * C + c];
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
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double);                \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t,      \
                                     int64_t);                                                                  \
  template void GeluForward<T>(T*, const T*, int64_t);                                                          \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                                               \
  template void EmbeddingForward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int64_t, int64_t);  \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, const int32_t*, int64_t, int64_t);       \
  template T CrossEntropyForward<T>(T*, const T*, const int32_t*, T, int64_t, int64_t);                         \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, T, int64_t, int64_t);

DP_INSTANTIATE(float)
DP_INSTANTIATE(double)

}  // namespace dynapipe::runtime::cpu
