#include "src/common/keyed_normal.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace dynapipe::keyed_normal {
namespace {

// The libm formula the generator replaces (what the weights were before).
float LibmNormal(uint64_t key, uint64_t index, float std) {
  const uint64_t base = key + 2 * index;
  const double u1 = (static_cast<double>(Mix(base) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(Mix(base + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

TEST_CASE("the series log and cos agree with libm to ~1e-16", "[init]") {
  double worst_log = 0, worst_cos = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    const uint64_t k = Mix(i) >> 11, j = Mix(i + (uint64_t{1} << 40)) >> 11;
    const double x = (static_cast<double>(k) + 0.5) * 0x1.0p-53;
    worst_log = std::max(worst_log, std::abs(detail::LogUnit(x) - std::log(x)) / std::max(1.0, std::abs(std::log(x))));
    const double turn = static_cast<double>(j) * 0x1.0p-53;
    worst_cos = std::max(worst_cos, std::abs(detail::CosTurn(j) - std::cos(2.0 * std::numbers::pi * turn)));
  }
  // Extremes: the smallest and largest uniforms, quadrant and octant edges.
  for (const uint64_t k : {uint64_t{0}, uint64_t{1}, (uint64_t{1} << 52), (uint64_t{1} << 53) - 1}) {
    const double x = (static_cast<double>(k) + 0.5) * 0x1.0p-53;
    worst_log = std::max(worst_log, std::abs(detail::LogUnit(x) - std::log(x)) / std::max(1.0, std::abs(std::log(x))));
  }
  for (const uint64_t j : {uint64_t{0}, uint64_t{1} << 50, uint64_t{1} << 51, (uint64_t{1} << 51) + (uint64_t{1} << 50),
                           uint64_t{3} << 51, (uint64_t{1} << 53) - 1}) {
    const double turn = static_cast<double>(j) * 0x1.0p-53;
    worst_cos = std::max(worst_cos, std::abs(detail::CosTurn(j) - std::cos(2.0 * std::numbers::pi * turn)));
  }
  CAPTURE(worst_log, worst_cos);
  CHECK(worst_log < 4e-16);
  // libm's side rounds its argument 2 pi t first (up to 4.4e-16 near 2 pi).
  CHECK(worst_cos < 1e-15);
}

TEST_CASE("keyed normals are the libm formula's floats but for rare rounding ties", "[init]") {
  const uint64_t key = StreamKey(7, "h.0.attn.qkv.w", 14);
  int differing = 0;
  double sum = 0, sum_sq = 0;
  constexpr int kN = 1000000;
  for (uint64_t i = 0; i < kN; ++i) {
    const float ours = Normal(key, i, 1.0f), libm = LibmNormal(key, i, 1.0f);
    if (ours != libm) {
      ++differing;
      // One float step at most: the doubles agree to ~1e-16.
      CHECK(std::nextafter(ours, libm) == libm);
    }
    sum += ours;
    sum_sq += static_cast<double>(ours) * ours;
  }
  CHECK(differing <= 3);
  const double mean = sum / kN, var = sum_sq / kN - mean * mean;
  CHECK(std::abs(mean) < 0.005);
  CHECK(std::abs(var - 1.0) < 0.01);
  // Scaling by std happens in double before the one rounding to float.
  CHECK(Normal(key, 5, 0.02f) == LibmNormal(key, 5, 0.02f));
}

TEST_CASE("streams are keyed by seed and name", "[init]") {
  CHECK(StreamKey(1, "wte", 3) != StreamKey(2, "wte", 3));
  CHECK(StreamKey(1, "wte", 3) != StreamKey(1, "wpe", 3));
  CHECK(Normal(StreamKey(1, "wte", 3), 0, 1.0f) != Normal(StreamKey(1, "wte", 3), 1, 1.0f));
}

}  // namespace
}  // namespace dynapipe::keyed_normal
