#include "planner/partition/batching.h"

#include <catch2/catch.hpp>
#include <limits>
#include <random>
#include <set>

#include "planner/partition/global_batches.h"

namespace dynapipe::planner {
namespace {

using Catch::Detail::Approx;

std::vector<Sample> Samples(std::mt19937& rng, int n, bool with_targets) {
  std::vector<Sample> s;
  for (int i = 0; i < n; ++i) {
    s.push_back({100 + i, 1 + static_cast<int>(rng() % 900), with_targets ? 1 + static_cast<int>(rng() % 200) : 0});
  }
  return s;
}

// Every sample exactly once; shapes cover their samples.
void CheckCover(const std::vector<Sample>& s, const std::vector<MicroBatch>& mbs, bool ed) {
  std::multiset<int> seen;
  for (const MicroBatch& mb : mbs) {
    CHECK(mb.shape.mbs >= 1);
    CHECK(mb.shape.seq % 8 == 0);
    std::vector<int> row_end(mb.shape.mbs, 0);
    for (const Placement& p : mb.samples) {
      seen.insert(p.sample);
      REQUIRE(p.row < mb.shape.mbs);
      CHECK(p.offset >= row_end[p.row]);  // packed segments never overlap
      row_end[p.row] = p.offset + s[p.sample].input;
      CHECK(row_end[p.row] <= mb.shape.seq);
      if (ed) CHECK(s[p.sample].target <= mb.shape.dec_seq);
    }
  }
  CHECK(seen.size() == s.size());
  for (size_t i = 0; i < s.size(); ++i) CHECK(seen.count(static_cast<int>(i)) == 1);
}

TEST_CASE("Ordering: decoder-only by length; encoder-decoder tour keeps neighbours close") {
  std::mt19937 rng(1);
  auto s = Samples(rng, 200, true);
  auto order = OrderSamples(s, false, 7);
  for (size_t i = 1; i < order.size(); ++i) CHECK(s[order[i - 1]].input <= s[order[i]].input);
  auto tour = OrderSamples(s, true, 7);
  CHECK(std::set<int>(tour.begin(), tour.end()).size() == s.size());
  CHECK(tour == OrderSamples(s, true, 7));  // deterministic
  // A nearest-neighbour tour is much shorter than file order.
  auto length = [&](const std::vector<int>& o) {
    long total = 0;
    for (size_t i = 1; i < o.size(); ++i) {
      total += std::labs(s[o[i]].input - s[o[i - 1]].input) + std::labs(s[o[i]].target - s[o[i - 1]].target);
    }
    return total;
  };
  std::vector<int> file(s.size());
  std::iota(file.begin(), file.end(), 0);
  CHECK(length(tour) * 5 < length(file));
}

TEST_CASE("Baselines cover every sample exactly once with valid shapes") {
  std::mt19937 rng(2);
  for (bool ed : {false, true}) {
    auto s = Samples(rng, 97, ed);
    auto order = OrderSamples(s, ed, 1);
    CheckCover(s, PaddingBatches(s, 8, 8, ed), ed);
    CheckCover(s, PackingBatches(s, 2, 1024, 8, ed), ed);
    CheckCover(s, TokenBasedBatches(s, order, 4096, 8, ed), ed);
    CheckCover(s, FixedBatches(s, order, 5, 8, ed), ed);
  }
}

TEST_CASE("Padding pads to the global maximum; packing fills rows; token budget holds") {
  std::vector<Sample> s = {{0, 10, 0}, {1, 300, 0}, {2, 20, 0}, {3, 700, 0}, {4, 5, 0}};
  for (const auto& mb : PaddingBatches(s, 2, 8, false)) CHECK(mb.shape.seq == 704);
  auto packed = PackingBatches(s, 1, 1024, 8, false);
  int rows = 0;
  for (const auto& mb : packed) rows += mb.shape.mbs;
  CHECK(rows == 2);  // 700+300+20 fits one 1024 row only with 10 and 5 in the next
  std::vector<int> order = OrderSamples(s, false, 1);
  for (const auto& mb : TokenBasedBatches(s, order, 640, 8, false)) {
    CHECK((mb.shape.mbs == 1 || static_cast<int64_t>(mb.shape.mbs) * mb.shape.seq <= 640));
  }
  // Efficiency: padding every sample to 704 wastes most of the compute.
  CHECK(PaddingEfficiency(s, PaddingBatches(s, 5, 8, false), false) == Approx(1035.0 / (5 * 704)));
}

TEST_CASE("Global batches close before the sample that would pass the budget") {
  std::vector<Sample> s;
  for (int i = 0; i < 10; ++i) s.push_back(Truncate(i, data::RawLength{100, 10}, 2048, false));
  auto batches = FormGlobalBatches(s, 330, false);
  REQUIRE(batches.size() == 4);  // 3 x 110 = 330 fits exactly
  CHECK(batches[0].size() == 3);
  CHECK(batches[3].size() == 1);
  // Truncation: decoder-only counts input + target, capped at max_seq.
  const Sample t = Truncate(5, data::RawLength{3000, 100}, 2048, false);
  CHECK(t.input == 2048);
  CHECK(t.target == 100);
  const Sample e = Truncate(5, data::RawLength{3000, 4000}, 2048, true);
  CHECK(e.input == 2048);
  CHECK(e.target == 2048);
  // One sample over budget still forms its own batch.
  CHECK(FormGlobalBatches(std::vector<Sample>{{0, 5000, 0}}, 100, false).size() == 1);
}

TEST_CASE("Truncation caps lengths near INT64_MAX without overflowing") {
  // A lengths file accepts any int64 ("9223372036854775807 1" came from
  // fuzz/lengths_fuzzer): input + target overflowed and wrapped to 0 tokens.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const Sample t = Truncate(0, data::RawLength{kMax, 1}, 2048, false);
  CHECK(t.input == 2048);
  CHECK(t.target == 1);
  const Sample u = Truncate(0, data::RawLength{1, kMax}, 2048, false);
  CHECK(u.input == 2048);
  CHECK(u.target == 2048);
  const Sample e = Truncate(0, data::RawLength{kMax, kMax}, 2048, true);
  CHECK(e.input == 2048);
  CHECK(e.target == 2048);
}


TEST_CASE("ApplyWork prices varlen attention by the samples' own lengths; other kernels keep the grid") {
  std::vector<Sample> s = {{1, 100, 0}, {2, 300, 0}, {3, 50, 0}, {4, 600, 0}};
  std::vector<MicroBatch> packed = PackingBatches(s, 1, 512, 8, false);
  std::vector<MicroBatch> grid = packed;
  ApplyWork(s, WorkModel{.varlen_attention = true}, std::span<MicroBatch>(packed));
  ApplyWork(s, WorkModel{.varlen_attention = false}, std::span<MicroBatch>(grid));
  int64_t cells = 0;
  for (size_t i = 0; i < packed.size(); ++i) {
    CHECK(grid[i].shape.padded());
    CHECK(packed[i].shape.mbs == grid[i].shape.mbs);
    CHECK(packed[i].shape.seq == grid[i].shape.seq);
    cells += packed[i].shape.work_cells();
  }
  // The 600-token sample is truncated to its 512-token row.
  CHECK(cells == 100 * 100 + 300 * 300 + 50 * 50 + 512 * 512);
}

TEST_CASE("ApplyWork gives each micro-batch the rows its LM head scores: the samples' loss tokens") {
  std::vector<Sample> s = {{1, 100, 10}, {2, 300, 40}, {3, 50, 0}, {4, 8, 20}};
  std::vector<MicroBatch> mbs = FromSplit(s, std::vector<int>{0, 1, 2, 3}, std::vector<int>{2, 4}, 8, false);
  ApplyWork(s, WorkModel{.varlen_attention = true}, std::span<MicroBatch>(mbs));
  CHECK(mbs[0].shape.scored == 10 + 40);
  // A target that fills its sample scores all but its first token; none
  // scored still prices one row.
  CHECK(mbs[1].shape.scored == 0 + 7);
  CHECK(mbs[0].shape.head_tokens() == 50);
  Shape grid{2, 304, 0};
  CHECK(grid.head_tokens() == 2 * 304);
  // Encoder-decoder: every target token, on the decoder side.
  std::vector<MicroBatch> ed = FromSplit(s, std::vector<int>{0, 1}, std::vector<int>{2}, 8, true);
  ApplyWork(s, WorkModel{}, std::span<MicroBatch>(ed));
  CHECK(ed[0].shape.scored == 50);
}

}  // namespace
}  // namespace dynapipe::planner
