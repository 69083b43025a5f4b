// Traces of a planned 2 x 2 iteration with made-up measurements: every
// planned and timed instruction becomes a slice on its rank's tracks, every
// send an arrow to the receive that waited for it, and the structural checker
// accepts it; it refuses traces with a dangling flow or an unnamed track.
#include "cli/trace.h"

#include <catch2/catch.hpp>
#include <random>

#include "absl/strings/str_replace.h"
#include "planner/cost_model/analytic_cost_model.h"
#include "planner/planner.h"

namespace dynapipe::cli {
namespace {

proto::GetIterationResponse PlannedIteration() {
  planner::PlannerConfig config;
  proto::ModelSpec& m = config.model;
  m.set_kind(proto::ModelKind::gpt);
  m.set_num_layers(4);
  m.set_hidden(256);
  m.set_heads(4);
  m.set_vocab(1000);
  m.set_max_positions(512);
  config.pp = 2;
  config.dp = 2;
  config.cluster.set_devices_per_node(4);
  config.cluster.mutable_device()->set_name("test-gpu");
  config.cluster.mutable_device()->set_peak_tflops(100);
  config.cluster.mutable_device()->set_memory_bandwidth_gbps(1000);
  config.cluster.set_intra_node_bandwidth_gbps(100);
  config.cluster.set_intra_node_latency_us(5);
  config.memory_limit_mb = 8000;
  auto cost = planner::AnalyticCostModel::Create(config.model, config.cluster.device(), {});
  REQUIRE(cost.ok());
  auto p = planner::Planner::Create(config, std::shared_ptr<const planner::LayerCostModel>(std::move(*cost)));
  REQUIRE(p.ok());
  std::vector<planner::Sample> batch;
  std::mt19937 rng(3);
  for (int i = 0; i < 48; ++i) batch.push_back({i, 16 + static_cast<int32_t>(rng() % 400), 8});
  auto plan = (*p)->Plan(batch, 7);
  REQUIRE(plan.ok());
  proto::GetIterationResponse it;
  for (const auto& rank_plan : plan->plans) {
    *it.add_plans() = rank_plan;
    proto::IterationReport* r = it.add_reports();
    r->set_rank(rank_plan.rank());
    r->set_iteration(7);
    double end = 0;
    for (int i = 0; i < rank_plan.instructions_size(); ++i) {
      const auto& ins = rank_plan.instructions(i);
      auto* t = r->add_timings();
      t->set_index(i);
      t->set_start_ms(1.2 * ins.sim_start_ms() + 0.05 * rank_plan.rank());
      t->set_end_ms(1.2 * ins.sim_end_ms() + 0.05 * rank_plan.rank());
      end = std::max(end, t->end_ms());
    }
    r->set_iteration_ms(end);
    r->set_peak_memory_mb(100 + rank_plan.rank());
  }
  return it;
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("An iteration's trace holds both timelines of every rank and an arrow per transfer") {
  const proto::GetIterationResponse it = PlannedIteration();
  std::string json;
  TraceStats stats;
  REQUIRE(IterationTrace(it, &json, &stats).ok());
  INFO(json.substr(0, 2000));
  CHECK(CheckTrace(json).ok());
  int instructions = 0, sends = 0;
  for (const auto& plan : it.plans()) {
    instructions += plan.instructions_size();
    for (const auto& ins : plan.instructions()) sends += ins.has_send_activation_start() || ins.has_send_grad_start();
  }
  REQUIRE(sends > 0);
  CHECK(stats.flows == sends);  // 2 stages: every send has its receive
  CHECK(Count(json, "\"ph\":\"X\"") == 2 * instructions);  // planned and measured
  CHECK(Count(json, "\"ph\":\"s\"") == sends);
  CHECK(Count(json, "\"name\":\"thread_name\"") == 4 * 4);
  CHECK(Count(json, "\"name\":\"rank 3 (stage 1, group 1)\"") == 1);
}

TEST_CASE("The checker refuses dangling flows, unnamed tracks and bad slices") {
  std::string json;
  TraceStats stats;
  REQUIRE(IterationTrace(PlannedIteration(), &json, &stats).ok());
  // A flow without its end.
  const size_t f = json.find("{\"ph\":\"f\"");
  REQUIRE(f != std::string::npos);
  std::string broken = json;
  broken.replace(f, json.find('}', f) - f + 1, "{\"ph\":\"C\",\"name\":\"x\",\"pid\":0,\"ts\":0,\"args\":{\"v\":1}}");
  CHECK_FALSE(CheckTrace(broken).ok());
  // A thread nobody named.
  CHECK_FALSE(CheckTrace(absl::StrReplaceAll(json, {{"\"name\":\"thread_name\",\"pid\":0,\"tid\":1,", "\"name\":\"other\",\"pid\":0,\"tid\":1,"}})).ok());
  // A negative duration.
  const size_t x = json.find("\"dur\":");
  REQUIRE(x != std::string::npos);
  CHECK_FALSE(CheckTrace(json.substr(0, x) + "\"dur\":-1" + json.substr(json.find(',', x))).ok());
  CHECK_FALSE(CheckTrace("{\"traceEvents\":{}}").ok());
  // Plans and reports that do not pair up.
  proto::GetIterationResponse uneven = PlannedIteration();
  uneven.mutable_reports()->RemoveLast();
  CHECK_FALSE(IterationTrace(uneven, &json, &stats).ok());
}

}  // namespace
}  // namespace dynapipe::cli
