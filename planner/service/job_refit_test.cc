// JobRefit's bookkeeping: which model planned each iteration, and the
// prediction errors the status endpoint shows. Plans come from the real
// planner; reports time every instruction on a synthetic machine.
#include "planner/service/job_refit.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "planner/cost_model/analytic_cost_model.h"
#include "planner/testing/test_specs.h"
#include "planner/testing/timed_report.h"

namespace dynapipe::planner::service {
namespace {

std::vector<Sample> Batch(std::mt19937& rng) {
  std::vector<Sample> out;
  std::uniform_int_distribution<int> len(16, 1024);
  for (int64_t id = 0, tokens = 0; tokens < 16384; ++id) {
    out.push_back({id, len(rng), 0});
    tokens += out.back().input;
  }
  return out;
}

// Every rank's report of `plans`: a forward costs 1 ms plus 1 us per token of
// its micro-batch, a backward twice that, anything else 0.05 ms.
std::vector<proto::IterationReport> Execute(const std::vector<proto::ExecutionPlan>& plans) {
  std::vector<proto::IterationReport> reports;
  for (const proto::ExecutionPlan& p : plans) {
    reports.push_back(testing::TimedReport(
        p,
        [&p](const proto::Instruction& ins) {
          if (!ins.has_forward() && !ins.has_backward()) return 0.05;
          const proto::MicroBatch& mb = p.micro_batches(ins.micro_batch());
          return (ins.has_backward() ? 2 : 1) * (1 + 1e-3 * mb.rows() * mb.seq_len());
        },
        0.5));
  }
  return reports;
}

TEST_CASE("Exploring iterations are flagged and count in no prediction error") {
  PlannerConfig config;
  config.model = testing::Gpt(4, 512, 8);
  config.pp = 2;
  config.dp = 1;
  config.max_seq_len = 1024;
  config.memory_limit_mb = 80000;
  config.cluster = testing::H100Cluster();
  auto cost = AnalyticCostModel::Create(config.model, config.cluster.device(), {});
  REQUIRE(cost.ok());
  auto base = Planner::Create(config, std::shared_ptr<const LayerCostModel>(std::move(*cost)));
  REQUIRE(base.ok());
  proto::CostRefitSpec spec;
  spec.set_mode(proto::CostRefitSpec::on);
  spec.set_min_iterations(3);
  JobRefit refit(std::move(*base), spec);

  std::mt19937 rng(3);
  constexpr int kIterations = 24;
  for (int64_t i = 0; i < kIterations; ++i) {
    auto plan = refit.PlannerFor(i)->Plan(Batch(rng), i);
    REQUIRE(plan.ok());
    const std::vector<proto::IterationReport> reports = Execute(plan->plans);
    refit.Remember(i, std::move(plan->plans));
    for (const auto& r : reports) REQUIRE(refit.Report(r).ok());
  }

  const RefitStatus st = refit.Status();
  REQUIRE(st.recent.size() == kIterations);
  double sum[2] = {0, 0};  // refit plans: [0] without, [1] with the exploring ones
  int n[2] = {0, 0}, explored = 0;
  // The status's error window: the last 20 iterations.
  for (size_t k = 0; k < st.recent.size(); ++k) {
    const RefitIteration& h = st.recent[k];
    INFO("iteration " << h.iteration);
    const PlanModel with = refit.PlannedWith(h.iteration);
    CHECK(h.explore == (with == PlanModel::kExplore));
    CHECK(h.refit_plan == (with != PlanModel::kBase));
    // The first refit follows iteration 2's report; iterations from 3 are
    // planned with it, every other one of the next 12 to explore.
    CHECK(h.refit_plan == (h.iteration >= 3));
    explored += h.explore;
    if (k + 20 < st.recent.size() || !h.refit_plan) continue;
    const double error = std::abs(h.predicted_ms - h.measured_ms) / h.measured_ms;
    if (!h.explore) {
      sum[0] += error;
      ++n[0];
    }
    sum[1] += error;
    ++n[1];
  }
  CHECK(explored >= 4);
  REQUIRE(n[0] > 0);
  CHECK(st.refit_error == Approx(sum[0] / n[0]).epsilon(1e-12));
  // The exploring plans' predictions are off by design: counting them would
  // show another error.
  CHECK(std::abs(sum[1] / n[1] - sum[0] / n[0]) > 1e-3);
  CHECK(refit.PlannedWith(kIterations + 5) == PlanModel::kBase);
}

}  // namespace
}  // namespace dynapipe::planner::service
