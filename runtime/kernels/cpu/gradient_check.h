#pragma once

// Test helpers of the CPU kernels' tests: random inputs and a check of an
// analytic gradient against central finite differences in double precision.

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace dynapipe::runtime::cpu {

using Vec = std::vector<double>;

inline Vec Random(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Checks d(sum(out * r))/d(x) from `analytic` against central differences of
// `forward` (which recomputes out from the current x). Relative tolerance 1e-6.
inline void CheckGradient(const char* name, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
  INFO(name);
  REQUIRE(analytic.size() == x.size());
  const double h = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
  }
  CHECK(worst < 1e-6);
}

inline double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace dynapipe::runtime::cpu
