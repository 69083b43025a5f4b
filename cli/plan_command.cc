#include "cli/plan_command.h"

#include <algorithm>
#include <filesystem>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/partition/global_batches.h"
#include "planner/planner.h"
#include "cli/args.h"
#include "src/data/lengths.h"
#include "cli/plan_setup.h"
#include "src/common/chrome_trace.h"
#include "src/common/file_util.h"
#include "src/common/json_writer.h"
#include "src/common/proto_io.h"
#include "src/common/stats.h"
#include "src/common/thread_pool.h"

namespace dynapipe::cli {
namespace {

using planner::Batching;
using planner::IterationPlan;

// The digits of each kind of number in `dynapipe plan --json`.
constexpr int kMsDecimals = 3, kRatioDecimals = 4, kMbDecimals = 1, kRateDecimals = 1;

// One iteration's plan: a JSON line of `dynapipe plan --json`.
std::string IterationJson(const IterationPlan& p, size_t samples) {
  JsonWriter w;
  w.BeginObject().Int("iteration", p.iteration).Str("batching", planner::BatchingName(p.batching));
  w.Int("samples", static_cast<int64_t>(samples)).Int("tokens", p.tokens);
  w.Key("micro_batches").BeginArray();
  for (const auto& g : p.groups) {
    for (const auto& mb : g) {
      w.BeginObject().Int("mbs", mb.shape.mbs).Int("seq", mb.shape.seq);
      if (mb.shape.dec_seq > 0) w.Int("dec_seq", mb.shape.dec_seq);
      w.EndObject();
    }
  }
  w.EndArray();
  w.Fixed("predicted_iteration_ms", p.predicted_ms, kMsDecimals);
  w.Fixed("padding_efficiency", p.padding_efficiency, kRatioDecimals);
  w.Key("peak_memory_mb").BeginArray();
  for (double m : p.peak_mb) w.Fixed(m, kMbDecimals);
  w.EndArray();
  // One schedule as a string, several (one per data-parallel group) as an array.
  w.Key("schedule");
  if (p.schedules.size() == 1) {
    w.String(planner::ScheduleName(p.schedules[0]));
  } else {
    w.BeginArray();
    for (auto k : p.schedules) w.String(planner::ScheduleName(k));
    w.EndArray();
  }
  w.Str("recompute", planner::RecomputeName(p.recompute)).Int("simulations", p.simulations);
  w.Int("candidates", p.candidates).Int("candidates_pruned", p.candidates_pruned);
  w.Fixed("dp_imbalance", p.dp_imbalance, kRatioDecimals);
  // Trades kept between data-parallel groups, and the slowest group's
  // pipeline before them.
  if (!p.rebalanced_ms.empty()) {
    w.Int("rebalance_trades", static_cast<int64_t>(p.rebalanced_ms.size()) - 1);
    w.Fixed("unbalanced_ms", p.rebalanced_ms.front(), kMsDecimals);
  }
  w.Key("plan_ms").BeginObject().Fixed("partition", p.timings.partition_ms, kMsDecimals);
  w.Fixed("schedule", p.timings.schedule_ms, kMsDecimals).Fixed("instructions", p.timings.instructions_ms, kMsDecimals);
  w.Fixed("validate", p.timings.validate_ms, kMsDecimals).Fixed("total", p.timings.total_ms, kMsDecimals);
  w.EndObject().EndObject();
  return w.Take();
}

std::string IterationText(const IterationPlan& p, size_t samples) {
  std::vector<std::string> mbs;
  int count = 0;
  for (const auto& g : p.groups) {
    for (const auto& mb : g) {
      ++count;
      mbs.push_back(mb.shape.dec_seq > 0 ? absl::StrCat(mb.shape.mbs, "x", mb.shape.seq, "/", mb.shape.dec_seq)
                                         : absl::StrCat(mb.shape.mbs, "x", mb.shape.seq));
    }
  }
  std::vector<std::string> peaks;
  for (double m : p.peak_mb) peaks.push_back(absl::StrFormat("%.0f", m));
  std::vector<std::string> schedules;
  for (auto k : p.schedules) schedules.push_back(planner::ScheduleName(k));
  return absl::StrFormat(
      "iter %d: %d samples, %d tokens, %d micro-batches [%s]\n"
      "  predicted %.2f ms, padding efficiency %.3f, peak MB per stage [%s], schedule %s, recompute %s%s\n"
      "  plan %.2f ms (partition %.2f, schedule %.2f, instructions %.2f, validate %.2f; %d simulations, "
      "%d of %d splits pruned)\n",
      p.iteration, samples, p.tokens, count, absl::StrJoin(mbs, " "), p.predicted_ms, p.padding_efficiency,
      absl::StrJoin(peaks, " "), absl::StrJoin(schedules, ","), planner::RecomputeName(p.recompute),
      p.groups.size() > 1 ? absl::StrFormat(", dp imbalance %.3f", p.dp_imbalance) : "", p.timings.total_ms,
      p.timings.partition_ms, p.timings.schedule_ms, p.timings.instructions_ms, p.timings.validate_ms, p.simulations,
      p.candidates_pruned, p.candidates);
}

struct MethodResult {
  Batching batching;
  std::vector<IterationPlan> plans;
  double tokens = 0, predicted_ms = 0;
  double tokens_per_s() const { return predicted_ms > 0 ? tokens / (predicted_ms / 1e3) : 0; }
  double padding_efficiency() const {
    double e = 0;
    for (const auto& p : plans) e += p.padding_efficiency;
    return plans.empty() ? 0 : e / plans.size();
  }
  // Slowest data-parallel group over the mean, median and worst over iterations.
  std::vector<double> imbalances() const {
    std::vector<double> v;
    for (const auto& p : plans) v.push_back(p.dp_imbalance);
    return v;
  }
};

// The flags of a run beyond the planner's set-up.
struct RunOptions {
  int64_t budget = 0;   // --global-batch-tokens
  int64_t iters = -1;   // --iters; negative: every batch
  int64_t threads = 1;  // --threads
  bool json = false, compare = false;
};

absl::StatusOr<RunOptions> RunOptionsFromArgs(const Args& args) {
  auto budget = args.Int("global-batch-tokens", 65536);
  auto iters = args.Int("iters", -1);
  auto threads = args.Int("threads", 1);
  for (const auto* v : {&budget, &iters, &threads}) {
    if (!v->ok()) return v->status();
  }
  if (*budget < 1) return absl::InvalidArgumentError("--global-batch-tokens: must be positive");
  if (*threads < 1 || *threads > 256) return absl::InvalidArgumentError("--threads: must be in 1..256");
  return RunOptions{*budget, *iters, *threads, args.Has("json"), args.Has("compare")};
}

using Batches = std::vector<std::vector<planner::Sample>>;

// The global batches of the lengths file (samples truncated to the set-up's
// max_seq_len), the first --iters of them.
absl::StatusOr<Batches> ReadBatches(const Args& args, const PlanSetup& setup, const RunOptions& o) {
  auto raw = data::ReadLengthsFile(args.Str("lengths"));
  if (!raw.ok()) return raw.status();
  const bool ed = setup.config.model.kind() == proto::ModelKind::t5;
  std::vector<planner::Sample> samples;
  samples.reserve(raw->size());
  for (size_t i = 0; i < raw->size(); ++i) {
    if (ed && (*raw)[i].target <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(args.Str("lengths"), ": sample ", i, " has no target length, which t5 needs"));
    }
    samples.push_back(planner::Truncate(static_cast<int64_t>(i), (*raw)[i], setup.config.max_seq_len, ed));
  }
  Batches batches = planner::FormGlobalBatches(samples, o.budget, ed);
  if (o.iters >= 0 && static_cast<size_t>(o.iters) < batches.size()) batches.resize(o.iters);
  if (batches.empty()) return absl::InvalidArgumentError("--iters: nothing to plan");
  return batches;
}

// Every batch planned with `method` (on the pool's threads with --threads > 1);
// the first failure names the method and iteration.
absl::StatusOr<MethodResult> PlanMethod(const planner::Planner& planner, const Batches& batches, Batching method,
                                        const planner::PlanRequest& request, bool parallel, ThreadPool& pool) {
  MethodResult r{method, std::vector<IterationPlan>(batches.size())};
  std::vector<absl::Status> errors(batches.size());
  auto plan_one = [&](int i) {
    auto p = planner.Plan(batches[i], i, method, request);
    if (p.ok()) {
      r.plans[i] = std::move(*p);
    } else {
      errors[i] = p.status();
    }
  };
  if (parallel) {
    pool.ParallelFor(static_cast<int>(batches.size()), plan_one);
  } else {
    for (int i = 0; i < static_cast<int>(batches.size()); ++i) plan_one(i);
  }
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].ok()) {
      return absl::Status(errors[i].code(),
                          absl::StrCat(planner::BatchingName(method), ", iteration ", i, ": ", errors[i].message()));
    }
  }
  for (const IterationPlan& p : r.plans) {
    r.tokens += p.tokens;
    r.predicted_ms += p.predicted_ms;
  }
  return r;
}

// The configured method, or with --compare every one; without --compare each
// iteration is printed once its method is planned.
absl::StatusOr<std::vector<MethodResult>> PlanMethods(const planner::Planner& planner, const Batches& batches,
                                                      Batching configured, const RunOptions& o, bool record,
                                                      std::ostream& out) {
  std::vector<Batching> methods = {configured};
  if (o.compare) {
    methods.clear();
    for (int b = 0; b < planner::kNumBatchings; ++b) methods.push_back(static_cast<Batching>(b));
  }
  planner::PlanRequest request;
  request.build_plans = true;
  request.validate = true;
  request.record = record;
  ThreadPool pool(static_cast<int>(std::max<int64_t>(1, o.threads)) - 1);
  std::vector<MethodResult> results;
  for (Batching method : methods) {
    absl::StatusOr<MethodResult> planned = PlanMethod(planner, batches, method, request, o.threads > 1, pool);
    if (!planned.ok()) return planned.status();
    MethodResult& r = *planned;
    if (!o.compare) {
      for (size_t i = 0; i < batches.size(); ++i) {
        out << (o.json ? IterationJson(r.plans[i], batches[i].size()) + "\n"
                       : IterationText(r.plans[i], batches[i].size()));
      }
    }
    results.push_back(std::move(r));
  }
  return results;
}

// --dump-plans: every rank's plan of every iteration, as JSON.
absl::Status DumpPlans(const std::string& dir, const MethodResult& main) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("--dump-plans: cannot create ", dir, ": ", ec.message()));
  for (const auto& p : main.plans) {
    for (const auto& plan : p.plans) {
      const absl::Status s = WriteFileAtomic(absl::StrCat(dir, "/iter_", p.iteration, "_rank_", plan.rank(), ".json"),
                                             ToJson(plan, /*pretty=*/true));
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// --trace: the first iteration's simulated schedule, a process per device,
// numbered from 1000 * the data-parallel group.
absl::Status WriteTrace(const std::string& path, const IterationPlan& p) {
  ChromeTraceWriter trace;
  for (size_t g = 0; g < p.sims.size(); ++g) {
    planner::AppendChromeTrace(p.sims[g], absl::StrCat("dp", g), static_cast<int>(g) * 1000, &trace);
  }
  return WriteFileAtomic(path, trace.Finish());
}

// Medians of planning time (and its parts) and of the prediction, over one method's iterations.
void PrintSummary(const MethodResult& main, const std::string& cost_description, bool json, std::ostream& out) {
  std::vector<double> plan_ms, pred, part, sched, instr, valid;
  for (const auto& p : main.plans) {
    plan_ms.push_back(p.timings.total_ms);
    pred.push_back(p.predicted_ms);
    part.push_back(p.timings.partition_ms);
    sched.push_back(p.timings.schedule_ms);
    instr.push_back(p.timings.instructions_ms);
    valid.push_back(p.timings.validate_ms);
  }
  if (json) {
    JsonWriter w;
    w.BeginObject().Bool("summary", true).Str("batching", planner::BatchingName(main.batching));
    w.Str("cost_model", cost_description).Int("iterations", static_cast<int64_t>(main.plans.size()));
    w.Fixed("median_plan_ms", Median(plan_ms), kMsDecimals).Fixed("p90_plan_ms", Percentile(plan_ms, 0.9), kMsDecimals);
    w.Key("median_plan_ms_parts").BeginObject().Fixed("partition", Median(part), kMsDecimals);
    w.Fixed("schedule", Median(sched), kMsDecimals).Fixed("instructions", Median(instr), kMsDecimals);
    w.Fixed("validate", Median(valid), kMsDecimals).EndObject();
    w.Fixed("median_predicted_iteration_ms", Median(pred), kMsDecimals);
    w.Fixed("tokens_per_s", main.tokens_per_s(), kRateDecimals);
    w.Fixed("padding_efficiency", main.padding_efficiency(), kRatioDecimals);
    w.Fixed("median_dp_imbalance", Median(main.imbalances()), kRatioDecimals).EndObject();
    out << w.str() << "\n";
  } else {
    out << absl::StrFormat(
        "summary: %d iterations, %s, cost model %s\n  plan time median %.2f ms (p90 %.2f), predicted iteration "
        "median %.2f ms, %.0f tokens/s, padding efficiency %.3f\n",
        main.plans.size(), planner::BatchingName(main.batching), cost_description, Median(plan_ms),
        Percentile(plan_ms, 0.9), Median(pred), main.tokens_per_s(), main.padding_efficiency());
  }
}

// --compare: a row per method, throughput relative to packing.
void PrintComparison(const std::vector<MethodResult>& results, size_t iterations, const std::string& cost_description,
                     bool json, std::ostream& out) {
  double packing = 0;
  for (const auto& r : results) {
    if (r.batching == Batching::kPacking) packing = r.tokens_per_s();
  }
  if (!json) {
    out << absl::StrFormat("%d iterations, cost model %s\n%-17s %14s %12s %12s %18s %13s\n", iterations,
                           cost_description, "method", "tokens/s", "vs packing", "padding eff", "median iter ms",
                           "dp imbalance");
  }
  for (const auto& r : results) {
    std::vector<double> pred, plan_ms;
    for (const auto& p : r.plans) {
      pred.push_back(p.predicted_ms);
      plan_ms.push_back(p.timings.total_ms);
    }
    const double rel = packing > 0 ? r.tokens_per_s() / packing : 0;
    if (json) {
      JsonWriter w;
      w.BeginObject().Str("method", planner::BatchingName(r.batching));
      w.Fixed("tokens_per_s", r.tokens_per_s(), kRateDecimals).Fixed("relative_to_packing", rel, kRatioDecimals);
      w.Fixed("padding_efficiency", r.padding_efficiency(), kRatioDecimals);
      w.Fixed("median_predicted_iteration_ms", Median(pred), kMsDecimals);
      w.Fixed("median_dp_imbalance", Median(r.imbalances()), kRatioDecimals);
      w.Fixed("max_dp_imbalance", Percentile(r.imbalances(), 1.0), kRatioDecimals);
      w.Fixed("median_plan_ms", Median(plan_ms), kMsDecimals).EndObject();
      out << w.str() << "\n";
    } else {
      out << absl::StrFormat("%-17s %14.0f %11.2fx %12.3f %18.2f %13.3f\n", planner::BatchingName(r.batching),
                             r.tokens_per_s(), rel, r.padding_efficiency(), Median(pred), Median(r.imbalances()));
    }
  }
}

}  // namespace

std::string PlanUsage() {
  return R"(usage: dynapipe plan --lengths FILE --model MODEL [flags]
  --lengths FILE            one sample per line: input_len [target_len]; '#' comments
  --model MODEL             ModelSpec file, or a name in configs/models (gpt-6.7b, gpt-tiny, ...)
  --stages N                pipeline stages (default 1)
  --dp N                    data-parallel groups (default 1)
  --layers-per-stage N|L    layers per stage, one value or a comma list
  --layer-to-device L       device per layer, comma list (interleaved layouts)
  --max-seqlen N            longer samples are truncated (default min(2048, model max_positions))
  --global-batch-tokens N   token budget per iteration (default 65536)
  --mem-limit-mb X          memory per device (default: the device's)
  --cluster FILE            ClusterSpec (devices per node, bandwidths, latencies)
  --profile FILE | --device NAME   measured CostProfile JSON, or analytic model of h100|h200|a100|cpu
  --batching METHOD         dynamic|packing|padding|token_based|fixed_mbs|packing_balanced|wlb
                            (default dynamic; packing_balanced: packing with data-parallel groups
                            balanced by tokens, as Megatron-Core; wlb: packing balanced by a
                            linear-plus-quadratic cost, as WLB-LLM)
  --ablate PARTS            switch parts of dynamic off, comma list: baselines (the other methods'
                            splits among its candidates), balanced (the varlen cost-balanced
                            partitioner), group_balance (partitioners' data-parallel groups),
                            rebalance (micro-batches traded between the slowest and fastest groups)
  --micro-batch-size N      padding / fixed_mbs size (default: best power of two)
  --micro-batch-tokens N    token_based budget (default: best power of two x 1024)
  --schedule S              auto|1f1b|interleaved_1f1b|wait_free_cyclic (default auto)
  --recompute R             auto|none|selective|full (default auto)
  --permutations N          micro-batch orders tried per schedule (default 4)
  --tolerance X             relative thinning of DP caps (default 0.02)
  --iters K                 plan the first K global batches (default: all)
  --threads N               plan iterations on N threads (default 1)
  --json                    one JSON object per iteration, then a summary object
  --compare                 run every batching method on the same batches
  --dump-plans DIR          write every rank's execution plan as JSON
  --trace FILE              Chrome trace of the first iteration's simulated schedule
  --zero1                   shard optimizer state over data-parallel ranks
  --attention K             varlen|materialized: what attention costs (default: the model's, else varlen);
                            materialized prices every pair of a row, as Megatron-LM with a mask
  --seed N                  seed for orderings and permutations (default 1)
)";
}

int RunPlanCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  const std::set<std::string> valued = {"lengths", "model", "stages", "dp", "layers-per-stage", "layer-to-device",
                                        "max-seqlen", "global-batch-tokens", "mem-limit-mb", "cluster", "profile",
                                        "device", "batching", "micro-batch-size", "micro-batch-tokens", "schedule",
                                        "recompute", "permutations", "tolerance", "iters", "threads", "dump-plans",
                                        "trace", "seed", "round", "attention", "ablate"};
  const std::set<std::string> switches = {"json", "compare", "zero1", "help"};
  auto fail = [&err](const absl::Status& s) {
    err << "dynapipe plan: " << s.message() << "\n";
    return 2;
  };
  auto args = Args::Parse(argv, valued, switches);
  if (!args.ok()) return fail(args.status());
  if (args->Has("help")) {
    out << PlanUsage();
    return 0;
  }
  if (!args->Has("lengths")) return fail(absl::InvalidArgumentError("--lengths is required (see --help)"));
  auto setup = SetupFromArgs(*args);
  if (!setup.ok()) return fail(setup.status());
  auto options = RunOptionsFromArgs(*args);
  if (!options.ok()) return fail(options.status());
  auto batches = ReadBatches(*args, *setup, *options);
  if (!batches.ok()) return fail(batches.status());
  auto planner = planner::Planner::Create(setup->config, setup->cost);
  if (!planner.ok()) return fail(planner.status());
  auto results = PlanMethods(**planner, *batches, setup->config.batching, *options, args->Has("trace"), out);
  if (!results.ok()) return fail(results.status());

  const MethodResult& main = results->front();
  if (args->Has("dump-plans")) {
    if (const absl::Status s = DumpPlans(args->Str("dump-plans"), main); !s.ok()) return fail(s);
  }
  if (args->Has("trace")) {
    if (const absl::Status s = WriteTrace(args->Str("trace"), main.plans[0]); !s.ok()) return fail(s);
  }
  if (options->compare) {
    PrintComparison(*results, batches->size(), setup->cost_description, options->json, out);
  } else {
    PrintSummary(main, setup->cost_description, options->json, out);
  }
  return 0;
}

}  // namespace dynapipe::cli
