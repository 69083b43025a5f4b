// The parts of a transformer block that GPT-2 does not use (ops.h): RMS
// norm, ReLU, gated GELU, SwiGLU and rotary positions, forward and backward. Like ops.cc, the float
// versions of the row reductions run in SIMD lanes and the double versions
// are the plain loops the gradient checks compare them against.

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cpu/vec_math.h"

namespace dynapipe::runtime::cpu {
namespace {

// Sum of x[k] * y[k] over a row, in SIMD lanes.
DP_INLINE float DotF(const float* x, const float* y, int64_t C) {
  using namespace simd;
  VF acc = Splat(0.0f);
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes) acc += Load(x + c) * Load(y + c);
  float sum = HorizontalSum(acc);
  for (; c < C; ++c) sum += x[c] * y[c];
  return sum;
}

DP_SIMD_CLONES void RmsNormRowsF(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                                 int64_t C, float eps) {
  using namespace simd;
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    const float s = 1.0f / std::sqrt(DotF(x, x, C) / C + eps);
    float* y = out + i * C;
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes) Store(y + c, Load(x + c) * s * Load(weight + c));
    for (; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[i] = s;
  }
}

// dx = s (w dy) - x s^3 mean(x w dy); dw += x s dy.
DP_SIMD_CLONES void RmsNormBackwardRowsF(float* dinp, float* dweight, const float* dout, const float* inp,
                                         const float* weight, const float* rstd, int64_t N, int64_t C) {
  using namespace simd;
  std::vector<float> wdy(C);
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    const float* dy = dout + i * C;
    float* dx = dinp + i * C;
    const float s = rstd[i];
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes) Store(wdy.data() + c, Load(weight + c) * Load(dy + c));
    for (; c < C; ++c) wdy[c] = weight[c] * dy[c];
    const float k = s * s * s * DotF(x, wdy.data(), C) / C;
    for (c = 0; c + kLanes <= C; c += kLanes) {
      const VF xv = Load(x + c);
      Store(dx + c, Load(dx + c) + Load(wdy.data() + c) * s - xv * k);
      Store(dweight + c, Load(dweight + c) + xv * s * Load(dy + c));
    }
    for (; c < C; ++c) {
      dx[c] += wdy[c] * s - x[c] * k;
      dweight[c] += x[c] * s * dy[c];
    }
  }
}

}  // namespace

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C, double eps) {
  if constexpr (std::is_same_v<T, float>) {
    RmsNormRowsF(out, rstd, inp, weight, N, C, static_cast<float>(eps));
  } else {
    for (int64_t i = 0; i < N; ++i) {
      const T* x = inp + i * C;
      T ms = 0;
      for (int64_t c = 0; c < C; ++c) ms += x[c] * x[c];
      const T s = T(1) / std::sqrt(ms / C + T(eps));
      for (int64_t c = 0; c < C; ++c) out[i * C + c] = x[c] * s * weight[c];
      rstd[i] = s;
    }
  }
}

template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N,
                     int64_t C) {
  if constexpr (std::is_same_v<T, float>) {
    RmsNormBackwardRowsF(dinp, dweight, dout, inp, weight, rstd, N, C);
  } else {
    for (int64_t i = 0; i < N; ++i) {
      const T* x = inp + i * C;
      const T* dy = dout + i * C;
      const T s = rstd[i];
      T dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += x[c] * weight[c] * dy[c];
      const T k = s * s * s * dot / C;
      for (int64_t c = 0; c < C; ++c) {
        dinp[i * C + c] += weight[c] * dy[c] * s - x[c] * k;
        dweight[c] += x[c] * s * dy[c];
      }
    }
  }
}

template <typename T>
void ReluForward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] > T(0) ? inp[i] : T(0);
}

template <typename T>
void ReluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (inp[i] > T(0)) dinp[i] += dout[i];
  }
}

template <typename T>
void GatedGeluForward(T* out, const T* inp, int64_t N, int64_t F) {
  for (int64_t i = 0; i < N; ++i) {
    T* y = out + i * F;
    const T* up = inp + i * 2 * F + F;
    GeluForward(y, inp + i * 2 * F, F);
    for (int64_t f = 0; f < F; ++f) y[f] *= up[f];
  }
}

// d gate = GELU'(gate) * up * dout; d up = GELU(gate) * dout.
template <typename T>
void GatedGeluBackward(T* dinp, const T* inp, const T* dout, int64_t N, int64_t F) {
  std::vector<T> scratch(F);
  for (int64_t i = 0; i < N; ++i) {
    const T* gate = inp + i * 2 * F;
    const T* up = gate + F;
    const T* dy = dout + i * F;
    T* dgate = dinp + i * 2 * F;
    T* dup = dgate + F;
    for (int64_t f = 0; f < F; ++f) scratch[f] = up[f] * dy[f];
    GeluBackward(dgate, gate, scratch.data(), F);
    GeluForward(scratch.data(), gate, F);
    for (int64_t f = 0; f < F; ++f) dup[f] += scratch[f] * dy[f];
  }
}

template <typename T>
void SwigluForward(T* out, const T* inp, int64_t N, int64_t F) {
  for (int64_t i = 0; i < N; ++i) {
    const T* gate = inp + i * 2 * F;
    const T* up = gate + F;
    T* y = out + i * F;
    for (int64_t f = 0; f < F; ++f) y[f] = gate[f] / (T(1) + std::exp(-gate[f])) * up[f];
  }
}

// With s = sigmoid(gate): d gate = s (1 + gate (1 - s)) * up * dout; d up = gate s * dout.
template <typename T>
void SwigluBackward(T* dinp, const T* inp, const T* dout, int64_t N, int64_t F) {
  for (int64_t i = 0; i < N; ++i) {
    const T* gate = inp + i * 2 * F;
    const T* up = gate + F;
    const T* dy = dout + i * F;
    T* dgate = dinp + i * 2 * F;
    T* dup = dgate + F;
    for (int64_t f = 0; f < F; ++f) {
      const T g = gate[f], sg = T(1) / (T(1) + std::exp(-g));
      dgate[f] += sg * (T(1) + g * (T(1) - sg)) * up[f] * dy[f];
      dup[f] += g * sg * dy[f];
    }
  }
}

template <typename T>
void RotaryApply(T* x, const int32_t* positions, int64_t N, int64_t stride, int64_t heads, int64_t hs, double base,
                 bool inverse) {
  const int64_t half = hs / 2;
  int32_t top = 0;
  for (int64_t n = 0; n < N; ++n) top = std::max(top, positions[n]);
  // cos and sin of every (position, pair) of the batch, in double.
  std::vector<T> cs(static_cast<size_t>((top + 1) * half * 2));
  for (int32_t p = 0; p <= top; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
      cs[(p * half + i) * 2] = T(std::cos(angle));
      cs[(p * half + i) * 2 + 1] = T(inverse ? -std::sin(angle) : std::sin(angle));
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    const T* c = cs.data() + static_cast<int64_t>(positions[n]) * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      T* a = x + n * stride + h * hs;
      T* b = a + half;
      for (int64_t i = 0; i < half; ++i) {
        const T u = a[i], w = b[i], co = c[2 * i], si = c[2 * i + 1];
        a[i] = u * co - w * si;
        b[i] = w * co + u * si;
      }
    }
  }
}

#define DP_INSTANTIATE_BLOCK(T)                                                                    \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                 \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t); \
  template void ReluForward<T>(T*, const T*, int64_t);                                             \
  template void ReluBackward<T>(T*, const T*, const T*, int64_t);                                  \
  template void GatedGeluForward<T>(T*, const T*, int64_t, int64_t);                               \
  template void GatedGeluBackward<T>(T*, const T*, const T*, int64_t, int64_t);                               \
  template void SwigluForward<T>(T*, const T*, int64_t, int64_t);                                  \
  template void SwigluBackward<T>(T*, const T*, const T*, int64_t, int64_t);                       \
  template void RotaryApply<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double, bool);

DP_INSTANTIATE_BLOCK(float)
DP_INSTANTIATE_BLOCK(double)

}  // namespace dynapipe::runtime::cpu
