#include "planner/partition/dp_partitioner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <random>

#include "planner/cost_model/analytic_cost_model.h"
#include "planner/partition/batching.h"

namespace dynapipe::planner {
namespace {

using Catch::Detail::Approx;

// Every contiguous split of n items (2^(n-1) of them), under the same table.
double BruteForce(const CostTable& table, const DpOptions& o, std::vector<int>* best_ends) {
  const int n = table.n();
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    std::vector<int> ends;
    for (int i = 1; i < n; ++i) {
      if (mask & (1u << (i - 1))) ends.push_back(i);
    }
    ends.push_back(n);
    double mx = 0, sum = 0;
    bool ok = true;
    int begin = 0;
    for (int e : ends) {
      const int k = e - begin;
      if (k > table.kmax(e)) {
        ok = false;
        break;
      }
      mx = std::max(mx, table.at(e, k));
      sum += table.at(e, k);
      begin = e;
    }
    if (!ok) continue;
    const double obj = PipelineObjective(mx, sum, o);
    if (obj < best) {
      best = obj;
      *best_ends = ends;
    }
  }
  return best;
}

double Score(const CostTable& table, const std::vector<int>& ends, const DpOptions& o) {
  double mx = 0, sum = 0;
  int begin = 0;
  for (int e : ends) {
    mx = std::max(mx, table.at(e, e - begin));
    sum += table.at(e, e - begin);
    begin = e;
  }
  return PipelineObjective(mx, sum, o);
}

// Up to `max_n` items, rows of up to a random cap of entries; costs grow
// with size, or (not monotone) may also shrink, to exercise that path.
CostTable RandomTable(std::mt19937& rng, int max_n, bool monotone) {
  const int n = 1 + static_cast<int>(rng() % max_n);
  const int kcap = 1 + static_cast<int>(rng() % n);
  CostTable table(n);
  std::uniform_real_distribution<double> fixed(0.1, 5), per(0.1, 3);
  for (int j = 1; j <= n; ++j) {
    double t = fixed(rng);
    for (int k = 1; k <= std::min(j, kcap); ++k) {
      t += monotone ? per(rng) : per(rng) - 1.5;
      table.Push(j, std::max(0.05, t));
    }
    table.FinishRow(j);
  }
  return table;
}

TEST_CASE("DP equals brute force on random tables") {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const CostTable table = RandomTable(rng, 12, /*monotone=*/trial % 5 != 0);
    const int n = table.n();
    DpOptions o{1 + static_cast<int>(rng() % 16), 1 + static_cast<int>(rng() % 2), 1 + static_cast<int>(rng() % 2), 0.0};
    INFO("trial " << trial << " n " << n << " S " << o.stages);
    std::vector<int> bf_ends;
    const double bf = BruteForce(table, o, &bf_ends);
    auto dp = SolveDp(table, o);
    REQUIRE(dp.ok());
    CHECK(dp->objective_ms == Approx(bf).epsilon(1e-12));
    CHECK(Score(table, dp->ends, o) == Approx(bf).epsilon(1e-12));
    CHECK(dp->ends.back() == n);
  }
}

// SolveDp with no pruning: every cap of the same ladder (or every distinct
// value at or above the floor), each cap's least-total split scored by its
// largest micro-batch, the `keep` best distinct ones, ties to the earlier cap.
std::vector<DpResult::Split> EveryCap(const CostTable& table, const DpOptions& o) {
  const int n = table.n();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double floor = 0, top = 0;
  std::vector<double> values;
  for (int i = 0; i < n; ++i) {  // the cheapest micro-batch holding item i
    double cover = kInf;
    for (int j = i + 1; j <= n; ++j) {
      for (int k = j - i; k <= table.kmax(j); ++k) cover = std::min(cover, table.at(j, k));
    }
    floor = std::max(floor, cover);
  }
  for (int j = 1; j <= n; ++j) {
    for (int k = 1; k <= table.kmax(j); ++k) values.push_back(table.at(j, k));
    top = std::max(top, table.at(j, table.kmax(j)));
  }
  std::vector<double> caps;
  if (o.tolerance > 0) {
    for (double c = floor; c < top; c *= 1 + o.tolerance) caps.push_back(c);
    caps.push_back(top);
  } else {
    for (double v : values) {
      if (v >= floor) caps.push_back(v);
    }
    std::sort(caps.begin(), caps.end());
    caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  }
  std::vector<DpResult::Split> found;
  for (double cap : caps) {
    std::vector<double> f(n + 1, kInf);
    std::vector<int> choice(n + 1, 0);
    f[0] = 0;
    for (int j = 1; j <= n; ++j) {
      for (int k = 1; k <= std::min(table.kmax(j), j); ++k) {
        if (table.at(j, k) <= cap && f[j - k] + table.at(j, k) < f[j]) {
          f[j] = f[j - k] + table.at(j, k);
          choice[j] = k;
        }
      }
    }
    if (f[n] == kInf) continue;
    DpResult::Split split;
    double mx = 0;
    for (int j = n; j > 0; j -= choice[j]) {
      mx = std::max(mx, table.at(j, choice[j]));
      split.ends.insert(split.ends.begin(), j);
    }
    split.objective_ms = PipelineObjective(mx, f[n], o);
    bool seen = false;
    for (const auto& s : found) seen = seen || s.ends == split.ends;
    if (!seen) found.push_back(split);
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const DpResult::Split& a, const DpResult::Split& b) { return a.objective_ms < b.objective_ms; });
  found.resize(std::min<size_t>(found.size(), std::max(1, o.keep)));
  return found;
}

TEST_CASE("Caps SolveDp skips could not have changed the splits it keeps") {
  std::mt19937 rng(29);
  int64_t tried = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const CostTable table = RandomTable(rng, 40, /*monotone=*/trial % 5 != 0);
    const int n = table.n();
    const double tolerances[] = {0.0, 0.02, 0.1};
    DpOptions o{1 + static_cast<int>(rng() % 16), 1 + static_cast<int>(rng() % 2), 1 + static_cast<int>(rng() % 4),
                tolerances[trial % 3]};
    o.keep = 1 + static_cast<int>(rng() % 3);
    INFO("trial " << trial << " n " << n << " S " << o.stages << " tolerance " << o.tolerance << " keep " << o.keep);
    auto dp = SolveDp(table, o);
    REQUIRE(dp.ok());
    const std::vector<DpResult::Split> every = EveryCap(table, o);
    REQUIRE(dp->alternatives.size() == every.size());
    for (size_t i = 0; i < every.size(); ++i) {
      CHECK(dp->alternatives[i].objective_ms == every[i].objective_ms);
      CHECK(dp->alternatives[i].ends == every[i].ends);
    }
    CHECK(dp->ends == every[0].ends);
    tried += dp->caps_tried;
  }
  // The same trials with the bubble-term break alone try 25,573 caps; with
  // the bound on what a later cap can add, 14,197.
  CHECK(tried < 20000);
}

// An 8-layer GPT on 4 stages under the analytic model, 9 GB per device.
proto::ModelSpec SmallModel() {
  proto::ModelSpec model;
  model.set_kind(proto::ModelKind::gpt);
  model.set_num_layers(8);
  model.set_hidden(1024);
  model.set_heads(16);
  model.set_vocab(32000);
  model.set_max_positions(8192);
  return model;
}

// The analytic model of SmallModel on a 300 TFLOPS, 2 TB/s device.
std::shared_ptr<const LayerCostModel> SmallCost(const proto::AnalyticCostOptions& options = {}) {
  proto::DeviceSpec dev;
  dev.set_peak_tflops(300);
  dev.set_memory_bandwidth_gbps(2000);
  auto cost = AnalyticCostModel::Create(SmallModel(), dev, options);
  REQUIRE(cost.ok());
  return std::shared_ptr<const LayerCostModel>(std::move(*cost));
}

// SmallModel's 8 layers on 4 devices of `limit_mb`, two per device, or as
// `layer_to_device` says.
std::shared_ptr<const PipelineModel> PipelineOf(std::shared_ptr<const LayerCostModel> cost, double limit_mb,
                                                std::vector<int> layer_to_device = {}) {
  auto pm = PipelineModel::Create(SmallModel(), 4, layer_to_device, std::move(cost), {.limit_mb = limit_mb});
  REQUIRE(pm.ok());
  return std::make_shared<PipelineModel>(std::move(*pm));
}

std::shared_ptr<const PipelineModel> SmallPipeline(std::vector<int> layer_to_device = {}) {
  return PipelineOf(SmallCost(), 9000, std::move(layer_to_device));
}

TEST_CASE("DP equals brute force under the analytic cost model with memory limits") {
  ShapeCosts costs(SmallPipeline());
  std::mt19937 rng(3);
  std::lognormal_distribution<double> len(5.5, 1.0);
  int limited = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 2 + trial % 11;
    std::vector<Sample> samples;
    for (int i = 0; i < n; ++i) samples.push_back({i, std::clamp(static_cast<int>(len(rng)), 1, 4096), 0});
    const std::vector<int> order = OrderSamples(samples, false, 1);
    CostTable table(n);
    for (int j = 1; j <= n; ++j) {
      for (int k = 1; k <= j; ++k) {
        const Shape shape = PaddedShape(samples, std::span<const int>(order).subspan(j - k, k), 8, false);
        auto c = costs.Get(shape, Recompute::kNone);
        REQUIRE(c.ok());
        if (!costs.Fits(**c, false)) break;
        table.Push(j, (*c)->time_ms);
      }
      table.FinishRow(j);
      limited += table.kmax(j) < j;
    }
    const DpOptions o{4, 1, 1, 0.0};
    std::vector<int> bf_ends;
    const double bf = BruteForce(table, o, &bf_ends);
    auto dp = SolveDp(table, o);
    REQUIRE(dp.ok());
    CHECK(dp->objective_ms == Approx(bf).epsilon(1e-12));
  }
  CHECK(limited > 0);  // the memory limit actually bounded some micro-batches
}

TEST_CASE("ShapeCosts::Time answers as Get, cached or not, varlen or padded") {
  ShapeCosts costs(SmallPipeline());
  std::mt19937 rng(5);
  int fits = 0, misses = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int mbs = 1 + static_cast<int>(rng() % 64), seq = 8 * (1 + static_cast<int>(rng() % 512));
    // Every other shape computes only some of its grid's pairs (varlen).
    const int64_t grid = static_cast<int64_t>(mbs) * seq * seq;
    const Shape shape{mbs, seq, 0, trial % 2 ? 1 + static_cast<int64_t>(rng() % grid) : 0};
    for (const Recompute r : {Recompute::kNone, Recompute::kFull}) {
      // Padded shapes: Time first (not yet cached), then again from the cache.
      for (int pass = 0; pass < 2; ++pass) {
        INFO("mbs " << mbs << " seq " << seq << " cells " << shape.cells << " pass " << pass);
        auto t = costs.Time(shape, r);
        auto c = costs.Get(shape, r);
        REQUIRE(t.ok() == c.ok());
        if (!c.ok()) {
          ++misses;
          continue;
        }
        // A varlen shape is read off its grid's line (CellsLine): the same
        // time but for rounding, the same fits.
        if (shape.padded()) {
          CHECK(t->time_ms == (*c)->time_ms);
        } else {
          CHECK(t->time_ms == Approx((*c)->time_ms).epsilon(1e-12));
        }
        CHECK(t->fits[0] == costs.Fits(**c, false));
        CHECK(t->fits[1] == costs.Fits(**c, true));
        fits += t->fits[1];
      }
    }
  }
  // Both answers occur.
  CHECK(fits > 0);
  CHECK(fits < 1600 - misses);
}

TEST_CASE("A padded shape scoring fewer rows costs as computed whole, from its cached grid and one head query") {
  // One chunk per device, and interleaved (the head's device has another chunk).
  const bool interleaved = GENERATE(false, true);
  std::shared_ptr<const PipelineModel> pm =
      SmallPipeline(interleaved ? std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3} : std::vector<int>{});
  INFO("interleaved " << interleaved);
  ShapeCosts costs(pm);
  std::mt19937 rng(6);
  int cheaper = 0, others = 0, fits = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int mbs = 1 + static_cast<int>(rng() % 32), seq = 8 * (1 + static_cast<int>(rng() % 256));
    Shape shape{mbs, seq, 0};
    // One trial in four scores a handful of rows, so that the head's device
    // is not always the slowest.
    shape.scored = 1 + static_cast<int64_t>(rng() % (trial % 4 == 0 ? 4 : static_cast<int64_t>(mbs) * seq));
    for (const Recompute r : {Recompute::kNone, Recompute::kSelective}) {
      INFO("mbs " << mbs << " seq " << seq << " scored " << shape.scored);
      auto got = costs.Get(shape, r);  // the grid's cost, rescored
      std::vector<ChunkCost> chunks(pm->num_chunks());
      const absl::Status direct = pm->ChunkCosts(shape, r, chunks);
      REQUIRE(got.ok() == direct.ok());
      if (!got.ok()) continue;
      for (int c = 0; c < pm->num_chunks(); ++c) {
        CHECK((*got)->chunks[c].fw_ms == Approx(chunks[c].fw_ms).epsilon(1e-12));
        CHECK((*got)->chunks[c].bw_ms == Approx(chunks[c].bw_ms).epsilon(1e-12));
        CHECK((*got)->chunks[c].stored_mb == Approx(chunks[c].stored_mb).epsilon(1e-12));
        CHECK((*got)->chunks[c].peak_mb == Approx(chunks[c].peak_mb).epsilon(1e-12));
      }
      // Time summarizes from the grid's figures without its last chunk
      // (ShapeCost::Rest), to the bits of a whole summary.
      auto t = costs.Time(shape, r);
      REQUIRE(t.ok());
      CHECK(t->time_ms == (*got)->time_ms);
      CHECK(t->fits[0] == costs.Fits(**got, false));
      CHECK(t->fits[1] == costs.Fits(**got, true));
      fits += t->fits[1];
      // Chunks writes the same per-chunk costs without a ShapeCost.
      std::vector<ChunkCost> flat(pm->num_chunks());
      REQUIRE(costs.Chunks(shape, r, flat).ok());
      for (int c = 0; c < pm->num_chunks(); ++c) {
        CHECK(flat[c].fw_ms == (*got)->chunks[c].fw_ms);
        CHECK(flat[c].bw_ms == (*got)->chunks[c].bw_ms);
        CHECK(flat[c].stored_mb == (*got)->chunks[c].stored_mb);
        CHECK(flat[c].peak_mb == (*got)->chunks[c].peak_mb);
      }
      Shape grid = shape;
      grid.scored = 0;
      const std::shared_ptr<const ShapeCost> whole = *costs.Get(grid, r);
      cheaper += (*got)->time_ms < whole->time_ms;
      // Another device than the head's sets the time (the head's rows are few).
      others += t->time_ms == whole->rest.others_ms;
    }
  }
  CHECK(cheaper > 300);  // fewer scored rows, a cheaper head
  CHECK(others > 0);
  // Both answers occur.
  CHECK(fits > 0);
  CHECK(fits < 400);
}

TEST_CASE("A relative tolerance trades a bounded loss for fewer caps") {
  std::mt19937 rng(5);
  CostTable table(60);
  for (int j = 1; j <= 60; ++j) {
    double t = 1 + (rng() % 100) / 50.0;
    for (int k = 1; k <= j; ++k) table.Push(j, t += 0.5 + (rng() % 100) / 100.0);
    table.FinishRow(j);
  }
  const DpOptions exact{8, 1, 1, 0.0};
  DpOptions thinned = exact;
  thinned.tolerance = 0.05;
  auto a = SolveDp(table, exact);
  auto b = SolveDp(table, thinned);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->caps_tried < a->caps_tried);
  CHECK(b->objective_ms >= a->objective_ms);
  CHECK(b->objective_ms <= a->objective_ms * 1.05 + 1e-9);
}

TEST_CASE("A sample that fits in no micro-batch is an error") {
  CostTable table(3);
  table.Push(1, 1.0);
  table.FinishRow(1);
  table.FinishRow(2);  // sample 1 cannot stand even alone
  table.Push(3, 1.0);
  table.FinishRow(3);
  auto r = SolveDp(table, DpOptions{});
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
}


// Delegates to the analytic model (affine in the pairs), counting its
// calls; `squared` adds a term in the pairs squared (no longer affine), and
// it claims affinity as told.
class Wrapped : public LayerCostModel {
 public:
  Wrapped(std::shared_ptr<const LayerCostModel> base, bool squared, bool claims_affine)
      : base_(std::move(base)), squared_(squared), claims_affine_(claims_affine) {}
  absl::StatusOr<LayerCost> Cost(LayerKind kind, const Shape& shape, Recompute r) const override {
    ++calls;
    absl::StatusOr<LayerCost> c = base_->Cost(kind, shape, r);
    if (squared_ && c.ok() && kind == LayerKind::kEncoder) c->fw_ms += 1e-12 * shape.work_cells() * shape.work_cells();
    return c;
  }
  double ParamsMillions(LayerKind kind) const override { return base_->ParamsMillions(kind); }
  std::string Describe() const override { return "wrapped"; }
  bool AffineInCells() const override { return claims_affine_; }
  mutable int calls = 0;

 private:
  std::shared_ptr<const LayerCostModel> base_;
  bool squared_, claims_affine_;
};

// Time against a ShapeCost computed for the shape itself (Get).
void CheckTimeAsComputed(ShapeCosts& costs, const Shape& shape, Recompute r, double epsilon, int* fits,
                         int* fits_preferred) {
  INFO("mbs " << shape.mbs << " seq " << shape.seq << " cells " << shape.cells);
  auto t = costs.Time(shape, r);
  auto c = costs.Get(shape, r);
  REQUIRE(t.ok() == c.ok());
  if (!c.ok()) return;
  if (epsilon == 0) {
    CHECK(t->time_ms == (*c)->time_ms);
  } else {
    CHECK(t->time_ms == Approx((*c)->time_ms).epsilon(epsilon));
  }
  CHECK(t->fits[0] == costs.Fits(**c, false));
  CHECK(t->fits[1] == costs.Fits(**c, true));
  *fits += t->fits[0];
  *fits_preferred += t->fits[1];
}

TEST_CASE("A grid's varlen runs are read off its line from the first, the same bits whatever was asked before") {
  auto wrapped = std::make_shared<Wrapped>(SmallCost(), /*squared=*/false, /*claims_affine=*/true);
  ShapeCosts costs(PipelineOf(wrapped, 9000));
  const int mbs = 6, seq = 1024;
  const int64_t grid = int64_t{mbs} * seq * seq;
  const auto calls_for = [&](int m, int64_t cells) {
    const int before = wrapped->calls;
    REQUIRE(costs.Time(Shape{m, seq, 0, cells}, Recompute::kNone).ok());
    return wrapped->calls - before;
  };
  CHECK(calls_for(mbs, 12345) > 0);  // the grid's line is computed
  for (int64_t cells = 1; cells < grid; cells += grid / 20) CHECK(calls_for(mbs, cells) == 0);
  CHECK(calls_for(mbs + 1, 777) > 0);  // another grid has its own
  CHECK(calls_for(mbs + 1, 778) == 0);
  // A planner's answer must not depend on what its cache has seen (a
  // restarted planner plans a resumed job alike): a fresh ShapeCosts and one
  // that answered the grid before give the same bits.
  ShapeCosts fresh(PipelineOf(SmallCost(), 9000)), warm(PipelineOf(SmallCost(), 9000));
  std::mt19937 rng(10);
  for (int i = 0; i < 50; ++i) {
    REQUIRE(warm.Time(Shape{mbs, seq, 0, 1 + static_cast<int64_t>(rng() % grid)}, Recompute::kNone).ok());
  }
  for (int i = 0; i < 50; ++i) {
    const Shape shape{mbs, seq, 0, 1 + static_cast<int64_t>(rng() % grid)};
    ShapeCosts cold(PipelineOf(SmallCost(), 9000));
    const auto a = cold.Time(shape, Recompute::kNone), b = warm.Time(shape, Recompute::kNone),
               c = fresh.Time(shape, Recompute::kNone);
    REQUIRE((a.ok() && b.ok() && c.ok()));
    CHECK(a->time_ms == b->time_ms);
    CHECK(a->time_ms == c->time_ms);
  }
}

TEST_CASE("A varlen shape read off its grid's line fits exactly where computed, memory moving with the pairs or not") {
  // Materialized scores grow with the pairs, a fused kernel keeps none; the
  // limit puts each grid's fitting threshold inside its range of pairs.
  const auto attention = GENERATE(proto::AnalyticCostOptions::materialized, proto::AnalyticCostOptions::fused);
  const double limit_mb = attention == proto::AnalyticCostOptions::fused ? 3500 : 9000;
  INFO("attention " << attention);
  proto::AnalyticCostOptions options;
  options.set_attention(attention);
  ShapeCosts costs(PipelineOf(SmallCost(options), limit_mb));
  std::mt19937 rng(7);
  int fits = 0, fits_preferred = 0, shapes = 0, thresholds = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int mbs = 1 + static_cast<int>(rng() % 24), seq = 8 * (16 + static_cast<int>(rng() % 496));
    const int64_t grid = static_cast<int64_t>(mbs) * seq * seq;
    for (int k = 0; k < 40; ++k) {
      // Uniform pairs, and pairs at each end of the range.
      const int64_t cells = k < 30 ? 1 + static_cast<int64_t>(rng() % grid) : k < 35 ? 1 + k % 5 : grid - k % 5;
      CheckTimeAsComputed(costs, Shape{mbs, seq, 0, cells}, Recompute::kNone, 1e-12, &fits, &fits_preferred);
      ++shapes;
    }
    // Where one pair fits and the whole grid does not, the most pairs that
    // fit (found here from the computed costs) and one more, for both budgets.
    for (const bool preferred : {false, true}) {
      const auto computed_fits = [&](int64_t cells) {
        return costs.Fits(**costs.Get(Shape{mbs, seq, 0, cells}, Recompute::kNone), preferred);
      };
      if (!computed_fits(1) || computed_fits(grid)) continue;
      int64_t lo = 1, hi = grid;
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (computed_fits(mid) ? lo : hi) = mid;
      }
      CheckTimeAsComputed(costs, Shape{mbs, seq, 0, lo}, Recompute::kNone, 1e-12, &fits, &fits_preferred);
      CheckTimeAsComputed(costs, Shape{mbs, seq, 0, lo + 1}, Recompute::kNone, 1e-12, &fits, &fits_preferred);
      ++thresholds;
    }
  }
  // Each answer occurs; with materialized scores some grids fit only their
  // smaller runs of pairs, and the preferred budget is the tighter one.
  CHECK(fits_preferred > 0);
  CHECK(fits < shapes);
  if (attention == proto::AnalyticCostOptions::materialized) {
    CHECK(thresholds > 10);
    CHECK(fits_preferred < fits);
  }
}

TEST_CASE("A cost model that does not claim affinity, or claims it falsely, is asked for every varlen shape") {
  // Not claimed: no line, affine or not. Claimed falsely: the grid's
  // midpoint is off the line, so none either. Each gives the computed cost
  // to the bit, asking the model each time, a grid's later queries too.
  const auto [squared, claims_affine] = GENERATE(std::pair{false, false}, std::pair{true, false}, std::pair{true, true});
  INFO("squared " << squared << ", claims affine " << claims_affine);
  auto wrapped = std::make_shared<Wrapped>(SmallCost(), squared, claims_affine);
  ShapeCosts costs(PipelineOf(wrapped, 9000));
  std::mt19937 rng(8);
  int fits = 0, fits_preferred = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int mbs = 1 + static_cast<int>(rng() % 24), seq = 8 * (16 + static_cast<int>(rng() % 496));
    for (int k = 0; k < 10; ++k) {
      const int64_t cells = 1 + static_cast<int64_t>(rng() % (static_cast<int64_t>(mbs) * seq * seq));
      const int before = wrapped->calls;
      REQUIRE(costs.Time(Shape{mbs, seq, 0, cells}, Recompute::kNone).ok());
      CHECK(wrapped->calls > before);
      CheckTimeAsComputed(costs, Shape{mbs, seq, 0, cells}, Recompute::kNone, 0, &fits, &fits_preferred);
    }
  }
  CHECK(fits > 0);
}

}  // namespace
}  // namespace dynapipe::planner
