// Llama's parts of the block (ops.h): SwiGLU, rotary positions and
// grouped-query attention, against finite differences in double precision
// and against their definitions.
#include <cmath>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/kernels/cpu/gradient_check.h"
#include "runtime/kernels/cpu/ops.h"

namespace dynapipe::runtime::cpu {
namespace {

using Catch::Detail::Approx;

TEST_CASE("SwiGLU is SiLU(gate) * up, and its backward matches finite differences") {
  std::mt19937 rng(21);
  const int N = 3, F = 5;
  Vec gu = Random(N * 2 * F, rng, 1.5), r = Random(N * F, rng), out(N * F);
  auto loss = [&] {
    SwigluForward(out.data(), gu.data(), N, F);
    return Dot(out, r);
  };
  loss();
  const double g = gu[2 * F + 1], up = gu[2 * F + F + 1];  // row 1, gate 1
  CHECK(out[F + 1] == Approx(g / (1 + std::exp(-g)) * up).epsilon(1e-12));
  Vec d(N * 2 * F, 0);
  SwigluBackward(d.data(), gu.data(), r.data(), N, F);
  CheckGradient("swiglu", gu, d, loss);
}

TEST_CASE("Rotary positions turn each pair (i, i + hs/2) by position * base^(-2i/hs); inverse undoes it") {
  const int64_t hs = 4, heads = 2, stride = 10;  // 8 rotated values, then 2 left alone
  std::mt19937 rng(22);
  const std::vector<int32_t> pos = {0, 3, 7};
  const int64_t N = static_cast<int64_t>(pos.size());
  const Vec x0 = Random(N * stride, rng);
  Vec x = x0;
  RotaryApply(x.data(), pos.data(), N, stride, heads, hs, 100.0, false);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < hs / 2; ++i) {
        const double angle = pos[n] * std::pow(100.0, -2.0 * i / hs);
        const int64_t a = n * stride + h * hs + i, b = a + hs / 2;
        CHECK(x[a] == Approx(x0[a] * std::cos(angle) - x0[b] * std::sin(angle)).epsilon(1e-12));
        CHECK(x[b] == Approx(x0[b] * std::cos(angle) + x0[a] * std::sin(angle)).epsilon(1e-12));
      }
    }
    for (int64_t k = heads * hs; k < stride; ++k) CHECK(x[n * stride + k] == x0[n * stride + k]);
  }
  RotaryApply(x.data(), pos.data(), N, stride, heads, hs, 100.0, true);
  for (size_t k = 0; k < x.size(); ++k) CHECK(x[k] == Approx(x0[k]).margin(1e-12));
}

TEST_CASE("The inverse rotation is the rotation's backward (finite differences)") {
  const int64_t hs = 6, heads = 3, stride = 18;
  std::mt19937 rng(23);
  const std::vector<int32_t> pos = {5, 0, 11, 2};
  const int64_t N = static_cast<int64_t>(pos.size());
  Vec x = Random(N * stride, rng), r = Random(N * stride, rng);
  auto loss = [&] {
    Vec y = x;
    RotaryApply(y.data(), pos.data(), N, stride, heads, hs, 10000.0, false);
    return Dot(y, r);
  };
  Vec d = r;
  RotaryApply(d.data(), pos.data(), N, stride, heads, hs, 10000.0, true);
  CheckGradient("rotary", x, d, loss);
}

// Rows of [q (C) | k (kvh hs) | v (kvh hs)] widened to [q | k | v] of C each,
// query head h's key and value copied from kv head h / (NH / kvh).
Vec RepeatKv(const Vec& qkv, int64_t N, int64_t C, int64_t NH, int64_t kvh) {
  const int64_t hs = C / NH, W = C + 2 * kvh * hs;
  Vec out(N * 3 * C);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) out[n * 3 * C + c] = qkv[n * W + c];
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t src = h / (NH / kvh) * hs;
      for (int64_t i = 0; i < hs; ++i) {
        out[n * 3 * C + C + h * hs + i] = qkv[n * W + C + src + i];
        out[n * 3 * C + 2 * C + h * hs + i] = qkv[n * W + C + kvh * hs + src + i];
      }
    }
  }
  return out;
}

TEST_CASE("Grouped-query attention equals multi-head attention over repeated kv heads; backward by differences") {
  const AttentionKernel kernel = GENERATE(AttentionKernel::kVarlen, AttentionKernel::kMaterialized);
  const int64_t kvh = GENERATE(1, 2);
  INFO("kv heads " << kvh << ", materialized " << (kernel == AttentionKernel::kMaterialized));
  const int64_t B = 2, T = 5, C = 8, NH = 4, hs = C / NH, W = C + 2 * kvh * hs;
  const std::vector<int32_t> seg = {0, 0, 0, -1, -1, 0, 0, 1, 1, 1};
  std::mt19937 rng(24);
  Vec qkv = Random(B * T * W, rng), r = Random(B * T * C, rng), out(B * T * C);
  Vec att(AttentionProbsSize(seg.data(), B, T, NH, kernel));
  AttentionOptions<double> o;
  o.kv_heads = kvh;
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH, kernel, o);
    return Dot(out, r);
  };
  loss();
  const Vec wide = RepeatKv(qkv, B * T, C, NH, kvh);
  Vec mha(B * T * C);
  AttentionForward(mha.data(), att.data(), wide.data(), seg.data(), B, T, C, NH, kernel);
  for (size_t k = 0; k < out.size(); ++k) CHECK(out[k] == Approx(mha[k]).margin(1e-12));
  loss();  // att back to the grouped forward's (the same probabilities)
  Vec d(qkv.size(), 0);
  AttentionBackward(d.data(), r.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH, kernel, o);
  CheckGradient("dqkv", qkv, d, loss);
}

}  // namespace
}  // namespace dynapipe::runtime::cpu
