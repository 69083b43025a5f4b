#pragma once

// Elementwise float math in SIMD lanes without -ffast-math: GCC/Clang vector
// extensions of 16 floats, lowered to whatever the enclosing function's
// target offers (AVX-512, AVX2, SSE2). Callers are compiled as
// `DP_SIMD_CLONES` functions, so one binary runs the widest path the CPU has
// (chosen once at load time through an ifunc), and ops.cc is compiled with
// -ffp-contract=off so that every clone rounds identically: results do not
// depend on which clone runs.
//
// Exp: the range reduction x = n ln2 + r, |r| <= ln2 / 2, with ln2 split in
// two so n ln2 is exact, a degree-7 polynomial for e^r with the classical
// minimax coefficients for [-ln2/2, ln2/2], and 2^n built in the exponent
// bits. Error <= 2 ulp against a double-precision exp over the whole range
// (checked by ops_test); exp(x) is exactly 0 below -87.33 (so exp(-inf) = 0,
// which masked attention relies on) and +inf above 88.72.

#include <cstdint>
#include <cstring>

#include "src/common/simd_clones.h"

// Helpers taking or returning vectors are always inlined into their
// (cloned) callers, never called across an ABI boundary.
#define DP_INLINE __attribute__((always_inline)) inline

namespace dynapipe::runtime::cpu::simd {

inline constexpr int kLanes = 16;
typedef float VF __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t VI __attribute__((vector_size(kLanes * sizeof(int32_t))));

DP_INLINE VF Load(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
DP_INLINE void Store(float* p, VF v) { std::memcpy(p, &v, sizeof(v)); }
DP_INLINE VF Splat(float x) { return VF{} + x; }

// Lane-wise a < b ? x : y.
DP_INLINE VF SelectLess(VF a, VF b, VF x, VF y) {
  const VI m = a < b;  // all ones where true
  VI xi, yi;
  std::memcpy(&xi, &x, sizeof(x));
  std::memcpy(&yi, &y, sizeof(y));
  const VI r = (xi & m) | (yi & ~m);
  VF out;
  std::memcpy(&out, &r, sizeof(out));
  return out;
}

DP_INLINE VF Exp(VF x) {
  const VF hi = Splat(88.7228394f), lo = Splat(-87.3365478f);
  VF c = SelectLess(hi, x, hi, x);  // min(x, hi); NaN passes through
  c = SelectLess(c, lo, lo, c);     // max(c, lo)
  // n = round(c / ln2): adding and removing 1.5 * 2^23 rounds to nearest
  // (no reassociation without -ffast-math, so the compiler keeps both).
  const VF magic = Splat(12582912.0f);
  const VF n = (c * 1.44269504088896341f + magic) - magic;
  const VF r = (c - n * 0.693359375f) - n * -2.12194440e-4f;
  VF p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  // 2^n for n in [-126, 128] as 2^n1 * 2^n2 (each exponent in range; both
  // products are exact scalings unless the result itself overflows).
  const VI ni = __builtin_convertvector(n, VI);
  const VI n1 = ni >> 1, n2 = ni - n1;
  const VI b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  VF s1, s2;
  std::memcpy(&s1, &b1, sizeof(s1));
  std::memcpy(&s2, &b2, sizeof(s2));
  VF y = (p * s1) * s2;
  y = SelectLess(x, lo, Splat(0.0f), y);                   // underflow, -inf
  y = SelectLess(hi, x, Splat(__builtin_huge_valf()), y);  // overflow, +inf
  return y;
}

DP_INLINE float HorizontalSum(VF v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}
DP_INLINE float HorizontalMax(VF v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// Applies `f` (VF -> VF) to n floats from `in` to `out`; the tail goes
// through one zero-padded vector.
template <typename F>
DP_INLINE void Map(float* out, const float* in, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(out + i, f(Load(in + i)));
  if (i < n) {
    float buf[kLanes] = {};
    std::memcpy(buf, in + i, (n - i) * sizeof(float));
    Store(buf, f(Load(buf)));
    std::memcpy(out + i, buf, (n - i) * sizeof(float));
  }
}

}  // namespace dynapipe::runtime::cpu::simd
