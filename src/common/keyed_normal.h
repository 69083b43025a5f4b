#pragma once

// A counter-based N(0, std) generator whose every value is the same bits on
// the host and on a CUDA device: value `index` of a stream `key` depends on
// (key, index) alone, and is computed with integer operations and correctly
// rounded double additions, multiplications, divisions and square roots in a
// fixed order (no library log or cos, whose last bits differ between glibc
// and CUDA, and no fused multiply-adds, which would round once instead of
// twice). Both backends initialise model weights with it, so a CPU stage and
// a CUDA stage of one model start from identical weights, and a device fills
// a GPT-350M in milliseconds instead of the host taking ~20 s.
//
// The values are Box-Muller over two splitmix64 uniforms; log and cos are
// evaluated by series accurate to ~1e-16, so the floats are those of the
// libm formula except where a double lies within 1e-16 of a float rounding
// boundary (about one value in 10^8 or 10^9).
//
// Header-only: compiled by the host compiler, and by nvcc for device code.

#include <cstdint>

#if defined(__CUDACC__)
#define DP_KN_HD __host__ __device__ __forceinline__
#else
#define DP_KN_HD inline
#endif

namespace dynapipe::keyed_normal {

// splitmix64's finaliser.
DP_KN_HD uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The key of one named stream: FNV-1a of the name mixed with the seed.
inline uint64_t StreamKey(uint64_t seed, const char* name, uint64_t length) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint64_t i = 0; i < length; ++i) h = (h ^ static_cast<unsigned char>(name[i])) * 0x100000001b3ULL;
  return Mix(seed ^ Mix(h));
}

namespace detail {

// One correctly rounded operation each, never contracted with a neighbour.
DP_KN_HD double Barrier(double x) {
#if !defined(__CUDA_ARCH__) && defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
  // With FMA instructions available the host compiler may fuse a product
  // into the next sum; an empty asm makes the product a value it cannot see
  // through.
  __asm__("" : "+x"(x));
#endif
  return x;
}
DP_KN_HD double Mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return Barrier(a * b);
#endif
}
DP_KN_HD double Add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return Barrier(a + b);
#endif
}
DP_KN_HD double Div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return Barrier(a / b);
#endif
}
DP_KN_HD double Sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);  // IEEE correctly rounded
#endif
}

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kHalfPi = 1.57079632679489661923;
constexpr double kSqrt2 = 1.41421356237309504880;

// ln(x) for x = (k + 0.5) 2^-53 with 0 <= k < 2^53 (so x in (0, 1)):
// x = m 2^e with m in [sqrt(1/2), sqrt(2)) found by exact scaling, then
// ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series to
// s^25 (the next term is below 2e-20).
DP_KN_HD double LogUnit(double x) {
  int e = 0;
  double m = x;
  while (m < 1.0) {  // exact: multiplying by 2 only changes the exponent
    m = m * 2.0;
    --e;
  }
  if (m > kSqrt2) {
    m = m * 0.5;
    ++e;
  }
  const double s = Div(Add(m, -1.0), Add(m, 1.0));
  const double s2 = Mul(s, s);
  double p = 1.0 / 25.0;  // constants: rounded once, at compile time, on either side
  p = Add(Mul(p, s2), 1.0 / 23.0);
  p = Add(Mul(p, s2), 1.0 / 21.0);
  p = Add(Mul(p, s2), 1.0 / 19.0);
  p = Add(Mul(p, s2), 1.0 / 17.0);
  p = Add(Mul(p, s2), 1.0 / 15.0);
  p = Add(Mul(p, s2), 1.0 / 13.0);
  p = Add(Mul(p, s2), 1.0 / 11.0);
  p = Add(Mul(p, s2), 1.0 / 9.0);
  p = Add(Mul(p, s2), 1.0 / 7.0);
  p = Add(Mul(p, s2), 1.0 / 5.0);
  p = Add(Mul(p, s2), 1.0 / 3.0);
  p = Add(Mul(p, s2), 1.0);
  return Add(Mul(static_cast<double>(e), kLn2), Mul(Mul(2.0, s), p));
}

// sin(a) and cos(a) for 0 <= a <= pi/4 by their Taylor series (to a^19 and
// a^18; the next terms are below 1e-19).
DP_KN_HD double SinSmall(double a) {
  const double a2 = Mul(a, a);
  double p = -1.0 / 121645100408832000.0;  // -1/19!
  p = Add(Mul(p, a2), 1.0 / 355687428096000.0);
  p = Add(Mul(p, a2), -1.0 / 1307674368000.0);
  p = Add(Mul(p, a2), 1.0 / 6227020800.0);
  p = Add(Mul(p, a2), -1.0 / 39916800.0);
  p = Add(Mul(p, a2), 1.0 / 362880.0);
  p = Add(Mul(p, a2), -1.0 / 5040.0);
  p = Add(Mul(p, a2), 1.0 / 120.0);
  p = Add(Mul(p, a2), -1.0 / 6.0);
  p = Add(Mul(p, a2), 1.0);
  return Mul(a, p);
}
DP_KN_HD double CosSmall(double a) {
  const double a2 = Mul(a, a);
  double p = 1.0 / 6402373705728000.0;  // 1/18!
  p = Add(Mul(p, a2), -1.0 / 20922789888000.0);
  p = Add(Mul(p, a2), 1.0 / 87178291200.0);
  p = Add(Mul(p, a2), -1.0 / 479001600.0);
  p = Add(Mul(p, a2), 1.0 / 3628800.0);
  p = Add(Mul(p, a2), -1.0 / 40320.0);
  p = Add(Mul(p, a2), 1.0 / 720.0);
  p = Add(Mul(p, a2), -1.0 / 24.0);
  p = Add(Mul(p, a2), 0.5);
  return Add(1.0, -Mul(a2, p));
}

// cos(2 pi j 2^-53) for 0 <= j < 2^53: the quadrant and the octant come from
// j's top bits exactly, the angle within the octant is at most pi/4.
DP_KN_HD double CosTurn(uint64_t j) {
  const uint64_t quadrant = j >> 51;
  uint64_t f = j & ((uint64_t{1} << 51) - 1);  // angle within the quadrant: f 2^-51 quarter turns
  const bool upper = f > (uint64_t{1} << 50);  // past the octant: use the complement
  if (upper) f = (uint64_t{1} << 51) - f;
  const double a = Mul(static_cast<double>(f) * 0x1.0p-51, kHalfPi);  // the scaling is exact
  // cos and sin of the quadrant's angle phi (phi = a, or pi/2 - a when upper).
  const double cos_phi = upper ? SinSmall(a) : CosSmall(a);
  const double sin_phi = upper ? CosSmall(a) : SinSmall(a);
  switch (quadrant) {
    case 0:
      return cos_phi;
    case 1:
      return -sin_phi;
    case 2:
      return -cos_phi;
    default:
      return sin_phi;
  }
}

}  // namespace detail

// Value `index` of stream `key`, scaled by `std`.
DP_KN_HD float Normal(uint64_t key, uint64_t index, float std) {
  const uint64_t base = key + 2 * index;
  const uint64_t k = Mix(base) >> 11, j = Mix(base + 1) >> 11;
  const double u1 = detail::Add(static_cast<double>(k), 0.5) * 0x1.0p-53;  // the scaling is exact
  const double r = detail::Sqrt(detail::Mul(-2.0, detail::LogUnit(u1)));
  const double z = detail::Mul(detail::Mul(static_cast<double>(std), r), detail::CosTurn(j));
#if defined(__CUDA_ARCH__)
  return __double2float_rn(z);
#else
  return static_cast<float>(z);
#endif
}

}  // namespace dynapipe::keyed_normal

#undef DP_KN_HD
