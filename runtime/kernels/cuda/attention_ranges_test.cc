#include "runtime/kernels/cuda/attention_ranges.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "runtime/kernels/cpu/ops.h"

namespace dynapipe::runtime::cuda {
namespace {

// Every visible pair lies inside both of its ranges, and with contiguous
// segments the ranges hold nothing else.
void CheckRanges(const std::vector<int32_t>& seg_q, const std::vector<int32_t>& seg_k, int64_t B, int64_t Tq,
                 int64_t Tk, bool causal, bool contiguous) {
  const AttentionRanges r = MakeAttentionRanges(seg_q.data(), seg_k.data(), B, Tq, Tk, causal, false);
  REQUIRE(r.keys.size() == static_cast<size_t>(2 * B * Tq));
  REQUIRE(r.queries.size() == static_cast<size_t>(2 * B * Tk));
  int64_t missed = 0, extra = 0, visible = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < Tq; ++i) {
      for (int64_t j = 0; j < Tk; ++j) {
        const int32_t s = seg_q[b * Tq + i];
        const bool vis = s >= 0 && s == seg_k[b * Tk + j] && (!causal || j <= i);
        const int64_t qi = b * Tq + i, kj = b * Tk + j;
        const bool in_keys = r.keys[2 * qi] <= j && j < r.keys[2 * qi + 1];
        const bool in_queries = r.queries[2 * kj] <= i && i < r.queries[2 * kj + 1];
        visible += vis;
        missed += vis && !(in_keys && in_queries);
        extra += !vis && in_keys;
      }
    }
  }
  CHECK(visible > 0);
  CHECK(missed == 0);
  if (contiguous) CHECK(extra == 0);
}

TEST_CASE("Attention ranges hold exactly each sample's pairs for packed rows") {
  // Row 0: samples of 3, 4 and 2 tokens, then padding; row 1: one of 6.
  const std::vector<int32_t> seg = {0, 0, 0, 1, 1, 1, 1, 2, 2, -1, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1};
  CheckRanges(seg, seg, 2, 10, 10, false, true);
  CheckRanges(seg, seg, 2, 10, 10, true, true);
  const AttentionRanges r = MakeAttentionRanges(seg.data(), seg.data(), 2, 10, 10, true, false);
  CHECK(r.keys[2 * 5] == 3);  // token 5 (sample 1) sees keys 3..5
  CHECK(r.keys[2 * 5 + 1] == 6);
  CHECK(r.queries[2 * 5] == 5);  // and key 5 is seen by queries 5..6
  CHECK(r.queries[2 * 5 + 1] == 7);
  CHECK(r.keys[2 * 9] == 0);  // padding sees nothing
  CHECK(r.keys[2 * 9 + 1] == 0);
}

TEST_CASE("Cross-attention ranges pair each target with its own input") {
  // Inputs (Tk 6) and targets (Tq 4) of the same samples, in the same rows.
  const std::vector<int32_t> enc = {0, 0, 0, 1, 1, -1, 0, 0, 0, 0, 0, 0};
  const std::vector<int32_t> dec = {0, 1, 1, -1, 0, 0, -1, -1};
  CheckRanges(dec, enc, 2, 4, 6, false, true);
  const AttentionRanges r = MakeAttentionRanges(dec.data(), enc.data(), 2, 4, 6, false, false);
  CHECK(r.keys[2 * 1] == 3);
  CHECK(r.keys[2 * 1 + 1] == 5);
  CHECK(r.queries[2 * 6] == 0);  // row 1's inputs are read by its first two targets
  CHECK(r.queries[2 * 6 + 1] == 2);
}

TEST_CASE("Attention ranges stay supersets when a segment comes back, and whole rows widen them") {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int32_t> id(-1, 3);
  std::vector<int32_t> seg(3 * 40);
  for (auto& s : seg) s = id(rng);
  CheckRanges(seg, seg, 3, 40, 40, true, false);
  CheckRanges(seg, seg, 3, 40, 40, false, false);
  const std::vector<int32_t> packed = {0, 0, 1, 1, 1, -1};
  const AttentionRanges whole = MakeAttentionRanges(packed.data(), packed.data(), 1, 6, 6, true, true);
  CHECK(whole.keys[2 * 3] == 0);  // the packing baseline computes the row's causal prefix
  CHECK(whole.keys[2 * 3 + 1] == 4);
  CHECK(whole.queries[2 * 1] == 1);
  CHECK(whole.queries[2 * 1 + 1] == 6);
  CHECK(whole.keys[2 * 5 + 1] == 0);  // padding still nothing
}

TEST_CASE("The bucket table is the CPU's bucket at every distance") {
  for (bool bidirectional : {true, false}) {
    const int64_t Tq = 300, Tk = 170;
    const std::vector<int32_t> t = RelativeBucketTable(Tq, Tk, bidirectional, 32, 128);
    REQUIRE(t.size() == static_cast<size_t>(Tq + Tk - 1));
    int64_t wrong = 0;
    for (int64_t d = -(Tq - 1); d <= Tk - 1; ++d) {
      wrong += t[d + Tq - 1] != cpu::RelativePositionBucket(static_cast<int>(d), bidirectional, 32, 128);
    }
    CHECK(wrong == 0);
    CHECK(t.front() != t[Tq - 1]);  // far back is not the zero distance's bucket
  }
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
