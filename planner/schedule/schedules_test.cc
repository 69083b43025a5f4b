// Schedules and simulator against the makespans of DynaPipe's reference
// implementation (4 devices, 8 micro-batches, no permutation search, no memory
// limit). The reference test's cost set-up, reproduced here exactly:
//  - uniform: 8 layers of 1000 us forward and 1000 us backward (its default
//    backward multiplier is 1, not 2), 100 us per cross-device hop;
//  - hetero: forward [4000]*4 + [2000]*4 us times a per-micro-batch multiplier
//    m; backward given as 2x forward but listed in forward order, which the
//    reference reads in backward order, so layer i's backward is 2x the
//    forward of layer 7-i; 160*m us per hop.
// Layers that share a device consecutively are fused into one op.
#include "planner/schedule/schedules.h"

#include <catch2/catch.hpp>
#include <vector>

namespace dynapipe::planner {
namespace {

using Catch::Detail::Approx;

const std::vector<double> kMult = {1, 0.8, 1.2, 0.9, 1.1, 0.7, 1.4, 0.6};

// Builds fused per-chunk times from per-layer times and a device assignment.
PipelineTimes FromLayers(const std::vector<int>& assign, int num_mb,
                         const std::function<double(int layer, int mb)>& fw,
                         const std::function<double(int layer, int mb)>& bw,
                         const std::function<double(int mb)>& hop) {
  std::vector<std::vector<int>> chunk_layers;
  std::vector<int> chunk_device;
  for (size_t l = 0; l < assign.size(); ++l) {
    if (l == 0 || assign[l] != assign[l - 1]) {
      chunk_layers.push_back({});
      chunk_device.push_back(assign[l]);
    }
    chunk_layers.back().push_back(static_cast<int>(l));
  }
  PipelineTimes t;
  t.Resize(4, static_cast<int>(chunk_layers.size()), num_mb);
  t.chunk_device = chunk_device;
  for (int m = 0; m < num_mb; ++m) {
    for (int c = 0; c < t.num_chunks; ++c) {
      const size_t i = t.At(m, c);
      for (int l : chunk_layers[c]) {
        t.fw_ms[i] += fw(l, m);
        t.bw_ms[i] += bw(l, m);
      }
      t.stored_mb[i] = 1000.0 * chunk_layers[c].size();
      t.comm_fw_ms[i] = t.comm_bw_ms[i] = hop(m);
    }
  }
  return t;
}

PipelineTimes Uniform(const std::vector<int>& assign) {
  return FromLayers(
      assign, 8, [](int, int) { return 1.0; }, [](int, int) { return 1.0; }, [](int) { return 0.1; });
}

PipelineTimes Hetero(const std::vector<int>& assign) {
  auto fw = [](int l, int m) { return (l < 4 ? 4.0 : 2.0) * kMult[m]; };
  auto bw = [fw](int l, int m) { return 2 * fw(7 - l, m); };
  return FromLayers(assign, 8, fw, bw, [](int m) { return 0.16 * kMult[m]; });
}

double Makespan(ScheduleKind kind, const PipelineTimes& t) {
  auto orders = MakeSchedule(kind, t);
  REQUIRE(orders.ok());
  auto sim = Simulate(t, *orders, /*record=*/false);
  REQUIRE(sim.ok());
  return sim->makespan_ms;
}

const std::vector<int> kLinear = {0, 0, 1, 1, 2, 2, 3, 3};
const std::vector<int> kInterleaved = {0, 1, 2, 3, 0, 1, 2, 3};

TEST_CASE("Uniform pipeline matches the reference makespans") {
  CHECK(Makespan(ScheduleKind::kOneFOneB, Uniform(kLinear)) == Approx(45.6).margin(1e-6));
  CHECK(Makespan(ScheduleKind::kWaitFreeCyclic, Uniform(kLinear)) == Approx(44.6).margin(1e-6));
}

TEST_CASE("Heterogeneous micro-batches match the reference makespans") {
  CHECK(Makespan(ScheduleKind::kOneFOneB, Hetero(kLinear)) == Approx(233.472).margin(1e-6));
  CHECK(Makespan(ScheduleKind::kWaitFreeCyclic, Hetero(kLinear)) == Approx(212.752).margin(1e-6));
  CHECK(Makespan(ScheduleKind::kInterleaved1F1B, Hetero(kInterleaved)) == Approx(195.4).margin(1e-6));
}

TEST_CASE("Wait-free cyclic records the reference's per-device orders") {
  auto orders = WaitFreeCyclic(Uniform(kLinear));
  REQUIRE(orders.ok());
  auto names = [](const std::vector<SimOp>& ops) {
    std::string s;
    for (const auto& op : ops) s += (op.kind ? "B" : "F") + std::to_string(op.mb) + " ";
    return s;
  };
  CHECK(names((*orders)[0]) == "F0 F1 F2 F3 F4 F5 F6 B0 F7 B1 B2 B3 B4 B5 B6 B7 ");
  CHECK(names((*orders)[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 ");
}

TEST_CASE("1F1B is the textbook order") {
  auto orders = OneFOneB(Uniform(kLinear));
  REQUIRE(orders.ok());
  const std::vector<SimOp>& d0 = (*orders)[0];
  const std::vector<std::pair<int, int>> expect = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {0, 4}, {1, 1}, {0, 5},
                                                   {1, 2}, {0, 6}, {1, 3}, {0, 7}, {1, 4}, {1, 5}, {1, 6}, {1, 7}};
  REQUIRE(d0.size() == expect.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    CHECK(static_cast<int>(d0[i].kind) == expect[i].first);
    CHECK(d0[i].mb == expect[i].second);
  }
}

TEST_CASE("Schedules refuse layouts they do not apply to") {
  CHECK_FALSE(OneFOneB(Hetero(kInterleaved)).ok());
  CHECK_FALSE(Interleaved1F1B(Hetero(kLinear)).ok());
  CHECK(WaitFreeCyclic(Hetero({0, 1, 2, 3, 3, 2, 1, 0})).ok());  // zig-zag: only wait-free cyclic
}

TEST_CASE("Wait-free cyclic holds new micro-batches back under a memory limit") {
  PipelineTimes t = Uniform(kLinear);  // 2000 MB stored per micro-batch per stage
  auto unlimited = Simulate(t, *WaitFreeCyclic(t), false);
  REQUIRE(unlimited.ok());
  CHECK(unlimited->peak_mb[0] == Approx(7 * 2000.0));  // F0..F6 in flight before B0
  auto limited_orders = WaitFreeCyclic(t, 6000);
  REQUIRE(limited_orders.ok());
  auto limited = Simulate(t, *limited_orders, false);
  REQUIRE(limited.ok());
  for (double peak : limited->peak_mb) CHECK(peak <= 6000.0);
  CHECK(limited->makespan_ms > unlimited->makespan_ms);
  // A limit below one micro-batch still runs micro-batch 0, then can't admit more.
  CHECK(WaitFreeCyclic(t, 1000).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("The simulator reports deadlocks and malformed orders") {
  PipelineTimes t = Uniform(kLinear);
  auto orders = *OneFOneB(t);
  std::swap(orders[1][0], orders[1][4]);  // device 1 waits for B0 before F0 runs
  CHECK(Simulate(t, orders, false).status().code() == absl::StatusCode::kFailedPrecondition);
  auto dup = *OneFOneB(t);
  dup[0][1] = dup[0][0];
  CHECK(Simulate(t, dup, false).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dynapipe::planner
