// OrderLowerBound against the simulator: never above a simulated schedule of
// any kind (random pipelines, with and without a memory limit), equal to it
// where a schedule meets the bound, and 0 where it does not apply; and the
// search's orders, which do not depend on the order micro-batches come in.
#include "planner/schedule_search.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <vector>

namespace dynapipe::planner {
namespace {

using Catch::Detail::Approx;

// Equal within 1e-9 ms (Approx alone also allows a relative 1.2e-5).
Approx Near(double x) { return Approx(x).epsilon(0).margin(1e-9); }

// `devices` chunks, chunk c on devices[c]; micro-batch m's forward on every
// chunk `fw[m]`, its backward `ratio` times that, `hop` per transfer.
PipelineTimes Chain(const std::vector<int>& devices, const std::vector<double>& fw, double ratio, double hop) {
  PipelineTimes t;
  const int C = static_cast<int>(devices.size()), M = static_cast<int>(fw.size());
  t.Resize(C, C, M);
  t.chunk_device = devices;
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < C; ++c) {
      const size_t i = t.At(m, c);
      t.fw_ms[i] = fw[m];
      t.bw_ms[i] = ratio * fw[m];
      t.stored_mb[i] = 100;
      t.peak_mb[i] = 10;
      if (c + 1 < C) t.comm_fw_ms[i] = t.comm_bw_ms[i] = hop;
    }
  }
  return t;
}

double Simulated(ScheduleKind kind, const PipelineTimes& t, double limit_mb) {
  auto orders = MakeSchedule(kind, t, limit_mb);
  if (!orders.ok()) return -1;  // the limit admits nothing
  auto sim = Simulate(t, *orders, /*record=*/false);
  REQUIRE(sim.ok());
  return sim->makespan_ms;
}

std::vector<int> Identity(int n) {
  std::vector<int> id(n);
  std::iota(id.begin(), id.end(), 0);
  return id;
}

TEST_CASE("The chain bound is what wait-free cyclic reaches on a uniform pipeline") {
  // 4 stages, 8 micro-batches of 2 ms forward and backward per stage, 0.1 ms
  // hops (the reference set-up of schedules_test): the first forward's fill,
  // every op on the last stage, the last backward's way back.
  const PipelineTimes t = Chain({0, 1, 2, 3}, std::vector<double>(8, 2.0), 1.0, 0.1);
  CHECK(OrderLowerBound(t, Identity(8)) == Near(44.6));
  CHECK(Simulated(ScheduleKind::kWaitFreeCyclic, t, 1e18) == Near(44.6));
  CHECK(Simulated(ScheduleKind::kOneFOneB, t, 1e18) >= 44.6);
}

TEST_CASE("A heavy micro-batch's trip counts on every stage") {
  // 8 stages, 12 micro-batches of 1 ms forward and 2 ms backward per stage
  // but the fifth, 10x. Its chain: stage 0's forwards up to it (4 + 10), its
  // forward up stages 1-6 (60), its forward and backward on the last (30),
  // its backward down stages 6-1 (120), stage 0's backwards from it on
  // (20 + 7 x 2).
  std::vector<double> fw(12, 1.0);
  fw[4] = 10;
  const PipelineTimes t = Chain({0, 1, 2, 3, 4, 5, 6, 7}, fw, 2.0, 0.0);
  const double bound = OrderLowerBound(t, Identity(12));
  CHECK(bound == Near(14 + 60 + 30 + 120 + 34));
  // The per-device bound (its work, the fill behind the first micro-batch
  // and the drain behind the last) is 174 lower.
  CHECK(bound - (3 * (11 + 10.0) + 7 + 14) == Near(174));
  CHECK(Simulated(ScheduleKind::kWaitFreeCyclic, t, 1e18) >= bound - 1e-9);
  CHECK(Simulated(ScheduleKind::kOneFOneB, t, 1e18) >= bound - 1e-9);
}

// OrderLowerBound written out from its definition: the longest chain (j, k)
// over every j <= k, in O(M^2 C).
double ChainsByDefinition(const PipelineTimes& t) {
  const int M = t.num_mb, L = t.num_chunks - 1;
  double best = 0;
  for (int j = 0; j < M; ++j) {
    for (int k = j; k < M; ++k) {
      double chain = 0;
      for (int i = 0; i <= j; ++i) chain += t.fw_ms[t.At(i, 0)];
      for (int c = 0; c < L; ++c) chain += t.comm_fw_ms[t.At(j, c)] + (c > 0 ? t.fw_ms[t.At(j, c)] : 0.0);
      for (int i = j; i <= k; ++i) chain += t.fw_ms[t.At(i, L)] + t.bw_ms[t.At(i, L)];
      for (int c = 0; c < L; ++c) chain += t.comm_bw_ms[t.At(k, c)] + (c > 0 ? t.bw_ms[t.At(k, c)] : 0.0);
      for (int i = k; i < M; ++i) chain += t.bw_ms[t.At(i, 0)];
      best = std::max(best, chain);
    }
  }
  return best;
}

TEST_CASE("A heavy forward's climb counts on every stage") {
  // Backwards a tenth of forwards, the fifth forward 10x: stage 0's forwards
  // up to it (4 + 10), its climb (6 x 10), the last stage's ops from it on
  // (11 + 7 x 1.1), the last backward down 7 stages (0.7).
  std::vector<double> fw(12, 1.0);
  fw[4] = 10;
  const PipelineTimes t = Chain({0, 1, 2, 3, 4, 5, 6, 7}, fw, 0.1, 0.0);
  const double expected = 14 + 60 + (11 + 7 * 1.1) + 0.7;
  CHECK(OrderLowerBound(t, Identity(12)) == Near(expected));
  CHECK(Simulated(ScheduleKind::kWaitFreeCyclic, t, 1e18) >= expected - 1e-9);
}

TEST_CASE("The chain bound never exceeds a simulated schedule") {
  std::mt19937_64 rng(34);
  std::uniform_real_distribution<double> u(0, 1);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int C = 1 + static_cast<int>(rng() % 7), M = 1 + static_cast<int>(rng() % 20);
    std::vector<int> devices = Identity(C);
    if (trial % 4 >= 2) std::shuffle(devices.begin(), devices.end(), rng);  // 1F1B needs chunk c on device c
    PipelineTimes t;
    t.Resize(C, C, M);
    t.chunk_device = devices;
    for (int m = 0; m < M; ++m) {
      const double size = u(rng) < 0.15 ? 5 + 20 * u(rng) : 0.2 + 2 * u(rng);  // a few heavy micro-batches
      for (int c = 0; c < C; ++c) {
        const size_t i = t.At(m, c);
        t.fw_ms[i] = size * (0.7 + 0.6 * u(rng));  // stages differ
        t.bw_ms[i] = t.fw_ms[i] * (1 + 2 * u(rng));
        t.stored_mb[i] = 50 * size;
        t.peak_mb[i] = 5 * size;
        if (c + 1 < C) {
          t.comm_fw_ms[i] = 0.3 * u(rng);
          t.comm_bw_ms[i] = 0.3 * u(rng);
        }
      }
    }
    std::vector<int> order = Identity(M);
    if (trial % 2 == 1) std::shuffle(order.begin(), order.end(), rng);
    const PipelineTimes p = Permute(t, order);
    const double bound = OrderLowerBound(t, order);
    REQUIRE(bound == Near(OrderLowerBound(p, Identity(M))));
    if (C > 1) CHECK(bound == Near(ChainsByDefinition(p)));
    for (double limit : {1e18, 400.0}) {
      for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kWaitFreeCyclic}) {
        const double made = Simulated(kind, p, limit);
        if (made < 0) continue;
        CHECK(made >= bound - 1e-9);
        ++checked;
      }
    }
    SearchOptions options;
    options.seed = trial;
    const GroupSchedule found = SearchSchedule(t, 1e18, options);
    REQUIRE(found.found);
    CHECK(found.makespan_ms >= OrdersToSearch(t, options).lower_bound - 1e-9);
    // Orders skipped on their bound lose nothing: the search does at least
    // as well as every schedule of the orders it always tries.
    std::vector<int> reversed = Identity(M);
    std::reverse(reversed.begin(), reversed.end());
    for (const std::vector<int>& tried : {Identity(M), reversed}) {
      for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kWaitFreeCyclic}) {
        if (!ScheduleApplies(kind, t)) continue;
        CHECK(found.makespan_ms <= Simulated(kind, Permute(t, tried), 1e18) + 1e-9);
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("The search finds a good order whatever order the micro-batches come in") {
  // 8 stages, 16 micro-batches of FLAN-like spread (a few heavy ones), handed
  // over in random orders, as a token-based or fixed-size split hands them.
  // The tent order (by work: cheap ones fill and drain, dear ones in the
  // middle) is the same sequence for every input order, so the search ends
  // within a hair of one makespan; the input order alone does much worse.
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> size(0.0, 0.6);
  std::vector<double> fw(16);
  for (double& f : fw) f = 1 + size(rng);
  const PipelineTimes base = Chain(Identity(8), fw, 2.0, 0.05);
  double lo = 1e18, hi = 0, searched = 0, as_given = 0;
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int> order = Identity(16);
    std::shuffle(order.begin(), order.end(), rng);
    const PipelineTimes t = Permute(base, order);
    SearchOptions options;
    options.seed = trial;
    const GroupSchedule found = SearchSchedule(t, 1e18, options);
    options.permutations = 1;
    const GroupSchedule given = SearchSchedule(t, 1e18, options);
    REQUIRE(found.found);
    REQUIRE(given.found);
    CHECK(found.makespan_ms <= given.makespan_ms + 1e-9);
    lo = std::min(lo, found.makespan_ms);
    hi = std::max(hi, found.makespan_ms);
    searched += found.makespan_ms;
    as_given += given.makespan_ms;
  }
  INFO("searched " << lo << " - " << hi << " ms, mean " << searched / 12 << "; input order only, mean " << as_given / 12);
  CHECK(hi <= lo * 1.005);
  CHECK(searched <= 0.97 * as_given);
}

TEST_CASE("The chain bound does not apply to interleaved layouts") {
  const PipelineTimes t = Chain({0, 1, 0, 1}, std::vector<double>(6, 1.0), 2.0, 0.1);
  PipelineTimes shared = t;
  shared.num_devices = 2;
  CHECK(OrderLowerBound(shared, Identity(6)) == 0);
  // As many chunks as devices, but two on one device.
  CHECK(OrderLowerBound(Chain({0, 1, 1, 3}, std::vector<double>(6, 1.0), 2.0, 0.1), Identity(6)) == 0);
  CHECK(OrderLowerBound(Chain({2, 0, 3, 1}, std::vector<double>(6, 1.0), 2.0, 0.1), Identity(6)) > 0);
}

}  // namespace
}  // namespace dynapipe::planner
