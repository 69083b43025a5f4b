// Planning time per iteration (all ranks: partition + schedule search +
// instructions + validation, one thread) versus samples per global batch and
// pipeline stages, on the FLAN-like lengths, GPT-6.7B-like model, 80 GB per
// device, analytic H100 cost model, materialised or varlen attention. Run
// from the repository root:
//   bazel run --config=release //planner:planner_benchmark
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "planner/cost_model/analytic_cost_model.h"
#include "planner/partition/global_batches.h"
#include "planner/planner.h"
#include "planner/testing/test_specs.h"

namespace dynapipe::planner {
namespace {

std::vector<Sample> LoadFlan(int max_seq) {
  static const std::vector<data::RawLength> raw = [] {
    std::vector<data::RawLength> out;
    for (const char* path : {"tests/data/flan-like-lengths.txt", "../tests/data/flan-like-lengths.txt"}) {
      std::ifstream in(path);
      if (!in) continue;
      std::string line;
      while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ss(line);
        data::RawLength r;
        ss >> r.input >> r.target;
        out.push_back(r);
      }
      break;
    }
    if (out.empty()) {
      std::fprintf(stderr, "planner_benchmark: tests/data/flan-like-lengths.txt not found (run from the repository root)\n");
      std::exit(2);
    }
    return out;
  }();
  std::vector<Sample> s;
  for (size_t i = 0; i < raw.size(); ++i) s.push_back(Truncate(static_cast<int64_t>(i), raw[i], max_seq, false));
  return s;
}

// Materialised attention (every pair of a row), or varlen (pairs inside each
// sample: micro-batches priced by their own pairs, so not cached by shape).
absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(int stages, bool varlen) {
  PlannerConfig c;
  c.model = testing::Gpt67b();
  c.pp = stages;
  c.max_seq_len = 8192;
  c.memory_limit_mb = 80000;
  c.cluster = testing::H100Cluster();
  c.work.varlen_attention = varlen;
  auto cost = AnalyticCostModel::Create(c.model, c.cluster.device(), {});
  return Planner::Create(c, std::shared_ptr<const LayerCostModel>(std::move(*cost)));
}

// Consecutive batches of `n` samples from the file, cycled.
void Run(benchmark::State& state, int n, int stages, int64_t budget_tokens, bool varlen = false) {
  const auto all = LoadFlan(8192);
  std::vector<std::vector<Sample>> batches;
  if (budget_tokens > 0) {
    batches = FormGlobalBatches(std::span<const Sample>(all).subspan(0, 20000), budget_tokens, false);
    batches.resize(std::min<size_t>(batches.size(), 16));
  } else {
    for (size_t b = 0; b + n <= all.size() && batches.size() < 8; b += n) batches.emplace_back(all.begin() + b, all.begin() + b + n);
  }
  auto made = MakePlanner(stages, varlen);
  if (!made.ok()) {  // e.g. the whole model on one 80 GB device
    state.SkipWithError(std::string(made.status().message()).c_str());
    for (auto _ : state) {
    }
    return;
  }
  auto& planner = *made;
  size_t i = 0, samples = 0;
  double mbs = 0;
  for (auto _ : state) {
    auto plan = planner->Plan(batches[i % batches.size()], static_cast<int64_t>(i));
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      break;
    }
    samples += batches[i % batches.size()].size();
    for (const auto& g : plan->groups) mbs += g.size();
    ++i;
  }
  state.counters["samples"] = static_cast<double>(samples) / std::max<size_t>(1, i);
  state.counters["micro_batches"] = mbs / std::max<size_t>(1, i);
}

void BM_PlanVsSamples(benchmark::State& state) { Run(state, static_cast<int>(state.range(0)), 8, 0); }
BENCHMARK(BM_PlanVsSamples)->Arg(100)->Arg(250)->Arg(500)->Arg(1000)->Arg(2000)->Arg(4000)->Unit(benchmark::kMillisecond);

void BM_PlanVsStages(benchmark::State& state) { Run(state, 0, static_cast<int>(state.range(0)), 65536); }
BENCHMARK(BM_PlanVsStages)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond);

// The acceptance set-ups: 65,536-token batches on 8 stages; 131,072 on 16.
void BM_Reference8Stages(benchmark::State& state) { Run(state, 0, 8, 65536); }
BENCHMARK(BM_Reference8Stages)->Unit(benchmark::kMillisecond);
void BM_Reference16Stages(benchmark::State& state) { Run(state, 0, 16, 131072); }
BENCHMARK(BM_Reference16Stages)->Unit(benchmark::kMillisecond);
// The same with varlen attention, the models' default.
void BM_Reference8StagesVarlen(benchmark::State& state) { Run(state, 0, 8, 65536, /*varlen=*/true); }
BENCHMARK(BM_Reference8StagesVarlen)->Unit(benchmark::kMillisecond);
void BM_Reference16StagesVarlen(benchmark::State& state) { Run(state, 0, 16, 131072, /*varlen=*/true); }
BENCHMARK(BM_Reference16StagesVarlen)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dynapipe::planner

BENCHMARK_MAIN();
