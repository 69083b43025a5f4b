// The cost-balanced partitioners: every sample placed once inside its row,
// micro-batches and groups balanced by what they are balanced by, capacity
// and counts as documented, weights read from the cost model.
#include "planner/partition/balanced.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "planner/cost_model/analytic_cost_model.h"
#include "planner/partition/batching.h"
#include "planner/testing/test_specs.h"

namespace dynapipe::planner {
namespace {

std::vector<Sample> Samples(std::mt19937& rng, int n, int max_len, bool with_targets) {
  std::lognormal_distribution<double> len(5.0, 1.0);
  std::vector<Sample> s;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(static_cast<int>(len(rng)), 1, max_len);
    s.push_back({100 + i, l, with_targets ? std::clamp(l / 3, 1, max_len) : 0});
  }
  return s;
}

// Every sample exactly once, inside its row, segments of a row disjoint.
void CheckCover(const std::vector<Sample>& s, const std::vector<MicroBatch>& mbs, bool ed) {
  std::multiset<int> seen;
  for (const MicroBatch& mb : mbs) {
    CHECK(mb.packed);
    CHECK(mb.shape.mbs >= 1);
    CHECK(mb.shape.seq % 8 == 0);
    std::vector<int> enc_end(mb.shape.mbs, 0), dec_total(mb.shape.mbs, 0);
    for (const Placement& p : mb.samples) {
      seen.insert(p.sample);
      REQUIRE(p.row < mb.shape.mbs);
      CHECK(p.offset >= enc_end[p.row]);
      enc_end[p.row] = p.offset + s[p.sample].input;
      CHECK(enc_end[p.row] <= mb.shape.seq);
      dec_total[p.row] += ed ? s[p.sample].target : 0;
      CHECK(dec_total[p.row] <= mb.shape.dec_seq);
    }
  }
  CHECK(seen.size() == s.size());
  for (size_t i = 0; i < s.size(); ++i) CHECK(seen.count(static_cast<int>(i)) == 1);
}

// A GPT-like model on 4 stages of H100s, 60 GB each.
std::shared_ptr<const PipelineModel> Pipeline(bool varlen) {
  proto::ModelSpec model = testing::Gpt(8, 1024, 16);
  model.set_attention(varlen ? proto::AttentionKernel::varlen : proto::AttentionKernel::materialized);
  auto cost = AnalyticCostModel::Create(model, testing::H100(), {});
  REQUIRE(cost.ok());
  auto pm = PipelineModel::Create(model, 4, {}, std::shared_ptr<const LayerCostModel>(std::move(*cost)),
                                  {.limit_mb = 60000}, WorkModel{varlen});
  REQUIRE(pm.ok());
  return std::make_shared<PipelineModel>(std::move(*pm));
}

TEST_CASE("PackRows: tight grids hold every sample, never more than rows of the full length") {
  std::mt19937 rng(1);
  for (const bool ed : {false, true}) {
    for (int trial = 0; trial < 40; ++trial) {
      const auto s = Samples(rng, 1 + static_cast<int>(rng() % 60), 2048, ed);
      std::vector<int> items(s.size());
      for (size_t i = 0; i < s.size(); ++i) items[i] = static_cast<int>(i);
      const MicroBatch tight = PackRows(s, items, 2048, 8, ed, /*tight=*/true);
      const MicroBatch full = PackRows(s, items, 2048, 8, ed, /*tight=*/false);
      CheckCover(s, {tight}, ed);
      CheckCover(s, {full}, ed);
      CHECK(full.shape.seq == 2048);
      CHECK(tight.shape.seq <= 2048);
      int64_t tokens = 0;
      for (const Sample& x : s) tokens += x.input;
      const auto grid = [](const Shape& sh) { return static_cast<int64_t>(sh.mbs) * (sh.seq + sh.dec_seq); };
      CHECK(grid(tight.shape) >= tokens);
      CHECK(grid(tight.shape) <= grid(full.shape));
    }
  }
  // Three samples of 1000 fit one row of 3000, not rows of 2048.
  const std::vector<Sample> three = {{0, 1000, 0}, {1, 1000, 0}, {2, 1000, 0}};
  const MicroBatch m = PackRows(three, {0, 1, 2}, 4096, 8, false, true);
  CHECK(m.shape == Shape{1, 3000, 0});
}

TEST_CASE("RampTargets: linear from the edge weight over the ramp, 1 in the middle") {
  CHECK(RampTargets(2, Ramp{0.25, 1}) == std::vector<double>{1, 1});
  CHECK(RampTargets(5, Ramp{0.5, 1}) == std::vector<double>{0.5, 1, 1, 1, 0.5});
  CHECK(RampTargets(7, Ramp{0.25, 2}) == std::vector<double>{0.25, 0.625, 1, 1, 1, 0.625, 0.25});
  CHECK(RampTargets(4, Ramp{0.0, 3}) == std::vector<double>{0, 1.0 / 3, 1.0 / 3, 0});
  // A longer tail than head: the drain's ramp.
  CHECK(RampTargets(8, Ramp{0.25, 1, 3}) == std::vector<double>{0.25, 1, 1, 1, 1, 0.75, 0.5, 0.25});
  CHECK(RampTargets(5, Ramp{0.5, 1, 4}) == std::vector<double>{0.5, 0.875, 0.75, 0.625, 0.5});
}

TEST_CASE("BalancedBatches: groups of near-equal weight, per_group micro-batches each, weighted by the ramp") {
  std::mt19937 rng(2);
  const CostWeights w{1e-3, 1e-6};
  for (int trial = 0; trial < 30; ++trial) {
    const auto s = Samples(rng, 200, 1024, false);
    const int groups = 1 + trial % 4, per_group = 2 + trial % 7;
    const Ramp ramp{trial % 3 == 0 ? 1.0 : trial % 3 == 1 ? 0.5 : 0.25, 1 + trial % 3};
    INFO("groups " << groups << " per_group " << per_group << " edge " << ramp.edge << " length " << ramp.length);
    const auto mbs = BalancedBatches(s, groups, per_group, w, 1024, 8, false, ramp);
    CheckCover(s, mbs, false);
    REQUIRE(mbs.size() == static_cast<size_t>(groups * per_group));
    double heaviest_sample = 0;
    for (const Sample& x : s) heaviest_sample = std::max(heaviest_sample, w.Of(x, false));
    std::vector<std::vector<double>> loads(groups);  // per group, in execution order
    for (const MicroBatch& mb : mbs) {
      REQUIRE(mb.group >= 0);
      REQUIRE(mb.group < groups);
      double load = 0;
      for (const Placement& p : mb.samples) load += w.Of(s[p.sample], false);
      loads[mb.group].push_back(load);
    }
    const std::vector<double> target = RampTargets(per_group, ramp);
    const double weights = std::accumulate(target.begin(), target.end(), 0.0);
    std::vector<double> totals;
    for (const auto& g : loads) {
      REQUIRE(g.size() == static_cast<size_t>(per_group));
      totals.push_back(std::accumulate(g.begin(), g.end(), 0.0));
      // Each micro-batch within one sample of its share.
      for (int b = 0; b < per_group; ++b) {
        CHECK(std::abs(g[b] - target[b] * totals.back() / weights) <= heaviest_sample + 1e-9);
      }
    }
    const auto [lo, hi] = std::minmax_element(totals.begin(), totals.end());
    CHECK(*hi - *lo <= heaviest_sample + 1e-9);
  }
}

TEST_CASE("PackingBalancedBatches: groups get near-equal tokens; WlbBatches respect their capacity") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    const auto s = Samples(rng, 150, 2048, false);
    const int groups = 1 + trial % 4, rows = 1 << (trial % 3);
    const auto pb = PackingBalancedBatches(s, rows, 2048, 8, false, groups);
    CheckCover(s, pb, false);
    std::vector<int64_t> tokens(groups, 0);
    int longest = 0;
    for (const Sample& x : s) longest = std::max(longest, x.input);
    for (const MicroBatch& mb : pb) {
      REQUIRE(mb.group >= 0);
      CHECK(mb.shape.mbs <= rows);
      for (const Placement& p : mb.samples) tokens[mb.group] += s[p.sample].input;
    }
    const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
    CHECK(*hi - *lo <= longest);

    const auto wlb = WlbBatches(s, rows, 2048, 8, CostWeights{1e-3, 1e-6}, false, groups);
    CheckCover(s, wlb, false);
    CHECK(wlb.size() % groups == 0);
    for (const MicroBatch& mb : wlb) {
      int64_t t = 0;
      for (const Placement& p : mb.samples) t += s[p.sample].input;
      CHECK(t <= static_cast<int64_t>(rows) * 2048);
      CHECK(mb.shape.seq == 2048);
    }
  }
}

TEST_CASE("RampedRuns: contiguous runs of similar lengths per group, the cheapest at the ends") {
  ShapeCosts costs(Pipeline(false));
  std::mt19937 rng(4);
  for (int trial = 0; trial < 10; ++trial) {
    const auto s = Samples(rng, 120, 2048, false);
    const std::vector<int> order = OrderSamples(s, false, 1);  // as the planner hands it over: shortest first
    const int groups = 1 + trial % 3, per_group = 5 + trial % 4;
    const auto mbs = RampedRuns(s, order, groups, per_group, Ramp{0.25, 2}, costs, Recompute::kNone, 8);
    REQUIRE_FALSE(mbs.empty());
    std::multiset<int> seen;
    std::vector<std::vector<double>> times(groups);
    for (const MicroBatch& mb : mbs) {
      CHECK_FALSE(mb.packed);
      REQUIRE(mb.group >= 0);
      int longest = 0;
      for (const Placement& p : mb.samples) {
        seen.insert(p.sample);
        longest = std::max(longest, s[p.sample].input);
      }
      CHECK(mb.shape.seq == RoundUp(longest, 8));
      auto t = costs.Time(mb.shape, Recompute::kNone);
      REQUIRE(t.ok());
      times[mb.group].push_back(t->time_ms);
    }
    CHECK(seen.size() == s.size());
    for (const auto& g : times) {
      REQUIRE(g.size() >= 3);
      const double middle = *std::max_element(g.begin() + 1, g.end() - 1);
      CHECK(g.front() <= middle);
      CHECK(g.back() <= middle);
    }
  }
}

TEST_CASE("RampedRunMaker: one maker cuts every count and ramp as RampedRuns does afresh") {
  ShapeCosts costs(Pipeline(false));
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    const auto s = Samples(rng, 140, 2048, false);
    const std::vector<int> order = OrderSamples(s, false, 1);
    const int groups = 1 + trial % 3;
    RampedRunMaker maker(s, order, groups, costs, Recompute::kNone, 8);
    int compared = 0;
    for (const Ramp& ramp : {Ramp{0.5, 2, 4}, Ramp{0.1, 3, 6}, Ramp{0.25, 1}}) {
      for (int per_group : {4, 7, 11}) {
        const auto made = maker.Make(per_group, ramp);
        const auto fresh = RampedRuns(s, order, groups, per_group, ramp, costs, Recompute::kNone, 8);
        REQUIRE(made.size() == fresh.size());
        for (size_t i = 0; i < made.size(); ++i) {
          CHECK(made[i].group == fresh[i].group);
          CHECK(made[i].shape.mbs == fresh[i].shape.mbs);
          CHECK(made[i].shape.seq == fresh[i].shape.seq);
          REQUIRE(made[i].samples.size() == fresh[i].samples.size());
          for (size_t k = 0; k < made[i].samples.size(); ++k) {
            CHECK(made[i].samples[k].sample == fresh[i].samples[k].sample);
          }
        }
        compared += made.empty() ? 0 : 1;
      }
    }
    CHECK(compared == 9);
  }
}

TEST_CASE("RampedRuns: groups balanced by padded cost, the heaviest run first after the fill, lighter to the end") {
  ShapeCosts costs(Pipeline(false));
  std::mt19937 rng(6);
  for (int trial = 0; trial < 10; ++trial) {
    const auto s = Samples(rng, 160, 2048, false);
    const std::vector<int> order = OrderSamples(s, false, 1);  // as the planner hands it over: shortest first
    const int groups = 2 + trial % 3, per_group = 8;
    const auto mbs = RampedRuns(s, order, groups, per_group, Ramp{0.25, 1, 4}, costs, Recompute::kNone, 8);
    REQUIRE_FALSE(mbs.empty());
    // Each group's samples, alone: their loads differ by at most the
    // costliest sample (heaviest first onto the lightest group).
    std::vector<double> load(groups, 0);
    double costliest = 0;
    std::vector<std::vector<double>> times(groups);
    std::vector<std::vector<int>> longest(groups);  // per micro-batch in order
    for (const MicroBatch& mb : mbs) {
      longest[mb.group].push_back(0);
      for (const Placement& p : mb.samples) {
        longest[mb.group].back() = std::max(longest[mb.group].back(), s[p.sample].input);
        auto t = costs.Time(Shape{1, RoundUp(s[p.sample].input, 8), 0}, Recompute::kNone);
        REQUIRE(t.ok());
        load[mb.group] += t->time_ms;
        costliest = std::max(costliest, t->time_ms);
      }
      auto t = costs.Time(mb.shape, Recompute::kNone);
      REQUIRE(t.ok());
      times[mb.group].push_back(t->time_ms);
    }
    CHECK(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()) <=
          costliest * (1 + 1e-9));
    for (int g = 0; g < groups; ++g) {
      REQUIRE(times[g].size() == static_cast<size_t>(per_group));
      // The runs (ascending along the sorted order) take the tail's
      // positions lightest last, and the run of the longest samples sits
      // right after the first micro-batch.
      CHECK(std::max_element(longest[g].begin(), longest[g].end()) - longest[g].begin() == 1);
      for (int k = per_group - 4; k + 1 < per_group; ++k) CHECK(times[g][k + 1] <= times[g][k] * (1 + 1e-9));
    }
  }
}

TEST_CASE("CostWeightsOf: attention pairs cost only with a varlen kernel") {
  ShapeCosts varlen(Pipeline(true)), grid(Pipeline(false));
  auto v = CostWeightsOf(varlen, Recompute::kNone, 2048, 8);
  auto g = CostWeightsOf(grid, Recompute::kNone, 2048, 8);
  REQUIRE(v.ok());
  REQUIRE(g.ok());
  CHECK(v->per_token_ms > 0);
  CHECK(v->per_pair_ms > 0);
  CHECK(g->per_pair_ms == 0);
  // The weights reproduce the model: a row of one 2048-token sample against
  // a row of 2048 one-token samples differs by the pairs between them.
  auto one = varlen.Time(WorkShape({1, 2048, 0}, 2048LL * 2048, varlen.model().work()), Recompute::kNone);
  auto many = varlen.Time(WorkShape({1, 2048, 0}, 2048, varlen.model().work()), Recompute::kNone);
  REQUIRE(one.ok());
  REQUIRE(many.ok());
  CHECK(one->time_ms - many->time_ms == Catch::Detail::Approx(v->per_pair_ms * (2048.0 * 2048 - 2048)));
}

}  // namespace
}  // namespace dynapipe::planner
