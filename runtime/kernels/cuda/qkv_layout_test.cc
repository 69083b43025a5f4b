// The index arithmetic of grouped-query attention's rows (qkv_layout.h),
// which the CUDA kernels ExpandKvHeads and ReduceKvHeads run, checked on the
// host against the CPU attention's own reading of grouped rows
// (cpu::AttentionOptions::kv_heads): multi-head attention over the expanded
// rows must give the grouped attention's output, and its gradient summed
// back must give the grouped gradient. Runs without a GPU.

#include "runtime/kernels/cuda/qkv_layout.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/kernels/cpu/ops.h"

namespace dynapipe::runtime::cuda {
namespace {

// What ExpandKvKernel computes, on the host: (N, 3C) from (N, Width()).
std::vector<double> Expand(const std::vector<double>& in, int64_t N, const GroupedQkv& g) {
  const int64_t W = g.Width(), E = g.ExpandedWidth();
  std::vector<double> out(N * E);
  for (int64_t k = 0; k < N * E; ++k) out[k] = in[(k / E) * W + g.Source(k % E)];
  return out;
}

// What ReduceKvKernel computes, on the host: (N, Width()) from (N, 3C).
std::vector<double> Reduce(const std::vector<double>& in, int64_t N, const GroupedQkv& g) {
  const int64_t W = g.Width(), E = g.ExpandedWidth();
  std::vector<double> out(N * W);
  for (int64_t k = 0; k < N * W; ++k) {
    const GroupedQkv::Sum s = g.Sources(k % W);
    double sum = 0;
    for (int64_t m = 0; m < s.count; ++m) sum += in[(k / W) * E + s.first + m * s.step];
    out[k] = sum;
  }
  return out;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

TEST_CASE("Source and Sources are inverse maps: each grouped column feeds exactly the columns summed into it") {
  for (const GroupedQkv g : {GroupedQkv{64, 16, 4, 4}, GroupedQkv{64, 16, 4, 2}, GroupedQkv{96, 32, 3, 1},
                             GroupedQkv{256, 32, 8, 2}}) {
    INFO("C " << g.C << " heads " << g.heads << " kv heads " << g.kv_heads);
    std::vector<int> hits(g.Width(), 0);
    for (int64_t j = 0; j < g.ExpandedWidth(); ++j) {
      const int64_t src = g.Source(j);
      REQUIRE((src >= 0 && src < g.Width()));
      ++hits[src];
    }
    int64_t wrong = 0;
    for (int64_t c = 0; c < g.Width(); ++c) {
      const GroupedQkv::Sum s = g.Sources(c);
      wrong += hits[c] != s.count;
      for (int64_t m = 0; m < s.count; ++m) wrong += g.Source(s.first + m * s.step) != c;
      wrong += s.first + (s.count - 1) * s.step >= g.ExpandedWidth();
    }
    CHECK(wrong == 0);
    if (g.kv_heads == g.heads) {  // multi-head rows: the identity
      for (int64_t j = 0; j < g.ExpandedWidth(); ++j) wrong += g.Source(j) != j;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("attention over expanded rows is grouped-query attention; its gradient reduced is the grouped gradient") {
  const int64_t B = 2, T = 21, C = 64, NH = 4;
  // Packed and padded rows: two samples, then one and padding.
  std::vector<int32_t> seg(B * T, -1);
  for (int64_t t = 0; t < T; ++t) seg[t] = t < 12 ? 0 : 1;
  for (int64_t t = 0; t < 15; ++t) seg[T + t] = 0;
  for (const int64_t kv_heads : {int64_t{1}, int64_t{2}, int64_t{4}}) {
    INFO("kv heads " << kv_heads);
    const GroupedQkv g{C, C / NH, NH, kv_heads};
    const int64_t N = B * T;
    std::mt19937_64 rng(static_cast<uint64_t>(kv_heads));
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> qkv(N * g.Width()), dout(N * C);
    for (double& x : qkv) x = normal(rng);
    for (double& x : dout) x = normal(rng);
    cpu::AttentionOptions<double> grouped;
    grouped.kv_heads = kv_heads;
    const int64_t probs = cpu::AttentionProbsSize(seg.data(), B, T, NH);

    std::vector<double> want(N * C), att(probs), dwant(qkv.size(), 0.0);
    cpu::AttentionForward(want.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH, cpu::AttentionKernel::kVarlen,
                          grouped);
    cpu::AttentionBackward(dwant.data(), dout.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH,
                           cpu::AttentionKernel::kVarlen, grouped);

    const std::vector<double> expanded = Expand(qkv, N, g);
    std::vector<double> got(N * C), att2(probs), dexpanded(expanded.size(), 0.0);
    cpu::AttentionForward(got.data(), att2.data(), expanded.data(), seg.data(), B, T, C, NH);
    cpu::AttentionBackward(dexpanded.data(), dout.data(), expanded.data(), att2.data(), seg.data(), B, T, C, NH);
    CHECK(MaxAbsDiff(got, want) <= 1e-12);
    const std::vector<double> dgot = Reduce(dexpanded, N, g);
    CHECK(MaxAbsDiff(dgot, dwant) <= 1e-12);
    // Not vacuous: the keys' and values' gradients are there.
    double kv_sq = 0;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = C; c < g.Width(); ++c) kv_sq += dwant[n * g.Width() + c] * dwant[n * g.Width() + c];
    }
    CHECK(kv_sq > 1.0);
  }
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
