// Trains one job with several batching methods on the CPU backend, ranks as
// threads of this process (the same worker code the daemons run), and
// prints real tokens/s, measured vs predicted iteration time and losses for
// each, side by side in one run:
//   cpu_throughput --job configs/jobs/quickstart.pbtxt --data_root . --iterations 20
// (after deploy/quickstart.sh, which makes that job's dataset and cost profile).
// With --rounds N every (attention kernel, method) pair runs once per round,
// rounds interleaved, and a summary gives the medians and the median of the
// per-round ratios to packing (neighbours in time share the machine's load).
// The job's cost model is refit from measured iterations unless --norefit;
// after --warmup iterations every iteration's predicted and measured times
// are printed, and "pred err" is their median relative difference.
// "tokens/s" counts the iterations after the warm-up (tokens over the time
// from the end of the last warm-up iteration to the end of the run, so what
// is compared is the refit's plans), "run tok/s" the whole run. Odd rounds
// run the methods in reverse order, so no method always runs first.
// "cpu s" is the process's CPU time (user + system, every rank and the
// planner) over the run: where ranks share cores it, not the pipeline,
// sets the pace. With the refit on and several methods, each round ends with
// a cross-pricing: every method's final refit prices the same iterations'
// batches as every method would split them, so one sees whether a method's
// refit would have chosen another's split (each refit learns only from the
// plans its own method ran).
// With --turns N the methods instead take turns in one run on one set of
// ranks: N iterations each over the same N batches, the order reversed every
// block, each method planning with its own refit (cli::RunLocalTurns), and
// "vs packing" is the median over blocks of packing's time for the block's
// batches over the method's. Drift between runs on a shared machine can
// exceed the gap between methods; neighbouring blocks share its load. The
// median leaves out the blocks a method loses badly as readily as another
// tenant's stalls, so beside it stands the ratio of the blocks' summed
// times (what the run's throughput compares). Under it, "same batches":
// packing's time over the method's for each batch both trained (the i-th
// iteration of a method's block trains the batch of the i-th of packing's),
// the median of all and per micro-batch count the method chose for the
// batch: where a method loses, and at which of its own choices. With
// --plan_models each iteration's line is followed by the cost model that
// planned it (the refit's fitted terms), to read why a choice was made.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/local_run.h"
#include "planner/cost_model/refit_cost_model.h"
#include "planner/service/job_runtime.h"
#include "src/common/clock.h"
#include "src/common/proto_io.h"
#include "src/common/stats.h"
#include "src/common/flags.h"

ABSL_FLAG(std::string, job, "configs/jobs/quickstart.pbtxt", "JobSpec file");
ABSL_FLAG(std::string, data_root, ".", "relative dataset paths resolve here");
ABSL_FLAG(int, iterations, 20, "iterations per method");
ABSL_FLAG(std::string, methods, "dynamic,packing,padding", "batching methods to compare");
ABSL_FLAG(std::string, attention, "",
          "attention kernels to compare (varlen,materialized); empty: the job's model.attention");
ABSL_FLAG(int, rounds, 1, "interleaved repetitions of every kernel x method");
ABSL_FLAG(int, pp, 0, "override parallelism.pp");
ABSL_FLAG(int, dp, 0, "override parallelism.dp");
ABSL_FLAG(double, lr, 0, "override optimizer.lr");
ABSL_FLAG(int, curve, 0, "also print the loss every N iterations");
ABSL_FLAG(bool, refit, true,
          "learn the cost model from measured iterations (cost_refit.mode on); plans then depend on timings");
ABSL_FLAG(int, warmup, 20, "iterations before predicted vs measured is reported (the refit's warm-up)");
ABSL_FLAG(bool, per_iteration, true, "print predicted vs measured ms of every iteration after the warm-up");
ABSL_FLAG(bool, plan_models, false,
          "with --per_iteration, also the cost model each iteration was planned with (the refit's terms then)");
ABSL_FLAG(int, turns, 0,
          "0: each method a run of its own; N: the methods take turns in one run, N iterations each over the same "
          "batches (--iterations a multiple of N)");
ABSL_FLAG(std::string, cost_profile, "",
          "override cost_profile_path: a `dynapipe profile` output, relative paths under --data_root");

namespace {

using namespace dynapipe;

// Every field but run_tokens_per_s covers iterations [warm-up, n): means,
// and the median of |predicted - measured| / measured.
struct Row {
  double tokens_per_s = 0, measured_ms = 0, predicted_ms = 0, micro_batches = 0, padding = 0, error = 0;
  double run_tokens_per_s = 0;  // the whole run
  double cpu_s = 0;             // the process's user + system CPU seconds over the run
};

// The slowest rank's time of iteration i.
double MeasuredMs(const cli::LocalRunResult& run, int i) {
  double slowest = 0;
  for (const auto& rank : run.per_rank) slowest = std::max(slowest, rank[i].iteration_ms);
  return slowest;
}

// Iterations [begin, end) of a run.
struct Span {
  int begin = 0, end = 0;
};

// The fields but run_tokens_per_s over `spans` (disjoint, in order):
// tokens over the time from the end of the iteration before each span to
// the end of its last.
Row SummarizeSpans(const cli::LocalRunResult& run, int pp, const std::vector<Span>& spans) {
  Row row;
  int64_t tokens = 0;
  double seconds = 0, k = 0, efficiency = 0;
  std::vector<double> errors;
  for (const Span& span : spans) {
    for (size_t r = 0; r < run.per_rank.size(); r += pp) {  // the first pipeline stage of every group
      for (int i = span.begin; i < span.end; ++i) tokens += run.per_rank[r][i].tokens;
    }
    seconds += run.done_s[span.end - 1] - (span.begin > 0 ? run.done_s[span.begin - 1] : 0.0);
    for (int i = span.begin; i < span.end; ++i) {
      const double slowest = MeasuredMs(run, i);
      // An exploring plan's prediction is off by design (see JobRefit).
      if (!run.explore_plan[i]) errors.push_back(std::abs(run.predicted_ms[i] - slowest) / slowest);
      row.measured_ms += slowest;
      row.predicted_ms += run.predicted_ms[i];
      row.micro_batches += run.micro_batches[i];
      efficiency += run.padding_efficiency[i];
      ++k;
    }
  }
  row.tokens_per_s = tokens / seconds;
  row.measured_ms /= k;
  row.predicted_ms /= k;
  row.micro_batches /= k;
  row.padding = 1 - efficiency / k;
  row.error = Median(errors);
  return row;
}

Row Summarize(const cli::LocalRunResult& run, int pp, int n, int warmup) {
  Row row = SummarizeSpans(run, pp, {{std::clamp(warmup, 0, n - 1), n}});
  int64_t tokens = 0;
  for (size_t r = 0; r < run.per_rank.size(); r += pp) {
    for (int i = 0; i < n; ++i) tokens += run.per_rank[r][i].tokens;
  }
  row.run_tokens_per_s = tokens / run.wall_s;
  return row;
}

const char* KernelName(proto::AttentionKernel::Value k) { return proto::AttentionKernel::Value_Name(k).c_str(); }

// The run's settings from the flags, and its rows as they come.
struct Bench {
  proto::JobSpec spec;
  int warmup = 0, n = 0, rounds = 1, pp = 1;
  std::vector<proto::AttentionKernel::Value> kernels;
  std::vector<proto::BatchingSpec::Method> methods;  // one may come twice (an A/A check)
  std::vector<std::string> names;                    // [method index]: its name, "#2" on a second one
  int reference = -1;  // the method index of the first packing: ratios are to it (-1: none)
  std::map<std::pair<int, int>, std::vector<Row>> rows;  // [kernel][method index] -> one Row per round
  std::map<proto::BatchingSpec::Method, planner::RefitTerms> terms;  // this round's fitted refit terms
  int turns = 0;  // --turns
  // With --turns: [kernel][method index] -> packing's time over the method's, one per block after the warm-up.
  std::map<std::pair<int, int>, std::vector<double>> block_ratios;
  // Per (kernel, method) with --turns: packing's seconds and the method's,
  // summed over the blocks whose ratio is kept.
  std::map<std::pair<int, int>, std::pair<double, double>> block_seconds;
  // Per (kernel, method) with --turns: packing's time over the method's for
  // each batch both trained (exploring iterations left out), by the
  // method's micro-batch count for it: where a method loses, and at what
  // choice of its own.
  std::map<std::pair<int, int>, std::map<int, std::vector<double>>> same_batch;
  // The same ratios by whether the method (dynamic) chose its own split: [own].
  std::map<std::pair<int, int>, std::array<std::vector<double>, 2>> same_batch_origin;
};

// The job with the flags' overrides; returns the exit status.
int LoadJob(Bench& b) {
  proto::JobSpec& spec = b.spec;
  if (auto s = LoadProtoFile(absl::GetFlag(FLAGS_job), &spec); !s.ok()) {
    std::fprintf(stderr, "cpu_throughput: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_pp) > 0) spec.mutable_parallelism()->set_pp(absl::GetFlag(FLAGS_pp));
  if (absl::GetFlag(FLAGS_dp) > 0) spec.mutable_parallelism()->set_dp(absl::GetFlag(FLAGS_dp));
  if (absl::GetFlag(FLAGS_lr) > 0) spec.mutable_optimizer()->set_lr(absl::GetFlag(FLAGS_lr));
  if (!absl::GetFlag(FLAGS_cost_profile).empty()) spec.set_cost_profile_path(absl::GetFlag(FLAGS_cost_profile));
  spec.mutable_cost_refit()->set_mode(absl::GetFlag(FLAGS_refit) ? proto::CostRefitSpec::on : proto::CostRefitSpec::off);
  b.warmup = absl::GetFlag(FLAGS_warmup);
  b.n = absl::GetFlag(FLAGS_iterations);
  b.rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  b.turns = absl::GetFlag(FLAGS_turns);
  if (b.turns < 0 || (b.turns > 0 && (b.n < b.turns || b.n % b.turns != 0))) {
    std::fprintf(stderr, "cpu_throughput: --turns %d: --iterations (%d) must be a positive multiple of it\n", b.turns,
                 b.n);
    return 2;
  }
  spec.set_iterations(std::max<int64_t>(spec.iterations(), b.n));
  b.pp = std::max(1, spec.parallelism().pp());
  return 0;
}

// --attention (empty: the job's kernel) and --methods; returns the exit status.
int ParseKernelsAndMethods(Bench& b) {
  if (absl::GetFlag(FLAGS_attention).empty()) {
    const auto job_kernel = b.spec.model().attention();
    b.kernels.push_back(job_kernel == proto::AttentionKernel::unspecified ? proto::AttentionKernel::varlen : job_kernel);
  }
  for (absl::string_view k : absl::StrSplit(absl::GetFlag(FLAGS_attention), ',', absl::SkipEmpty())) {
    proto::AttentionKernel::Value kernel;
    if (!proto::AttentionKernel::Value_Parse(std::string(k), &kernel) || kernel == proto::AttentionKernel::unspecified) {
      std::fprintf(stderr, "cpu_throughput: --attention: unknown kernel \"%s\" (varlen, materialized)\n",
                   std::string(k).c_str());
      return 2;
    }
    b.kernels.push_back(kernel);
  }
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_methods), ',', absl::SkipEmpty())) {
    proto::BatchingSpec::Method method;
    if (!proto::BatchingSpec::Method_Parse(std::string(m), &method)) {
      std::fprintf(stderr, "cpu_throughput: --methods: unknown method \"%s\"\n", std::string(m).c_str());
      return 2;
    }
    const auto before = std::count(b.methods.begin(), b.methods.end(), method);
    if (method == proto::BatchingSpec::packing && b.reference < 0) b.reference = static_cast<int>(b.methods.size());
    b.methods.push_back(method);
    b.names.push_back(proto::BatchingSpec::Method_Name(method) + (before > 0 ? absl::StrCat("#", before + 1) : ""));
  }
  return 0;
}

// --curve and --per_iteration: the loss every N iterations, predicted vs
// measured after the warm-up (iteration t's method names[t]), and each job's
// cost model (its method jobs[j]) and the planning time.
void PrintIterations(const cli::LocalRunResult& run, const std::vector<std::string>& names,
                     const std::vector<std::string>& jobs, int first) {
  const int n = static_cast<int>(names.size());
  if (const int every = absl::GetFlag(FLAGS_curve); every > 0) {
    for (int i = 0; i < n; i += every) {
      std::printf("  %s iteration %d loss %.4f\n", names[i].c_str(), i, run.per_rank[0][i].loss);
    }
  }
  if (!absl::GetFlag(FLAGS_per_iteration)) return;
  for (int i = std::min(first, n - 1); i < n; ++i) {
    const double measured = MeasuredMs(run, i);
    std::printf("  %s iteration %d predicted %.1f ms measured %.1f ms (%+.0f%%)%s mb %d%s\n", names[i].c_str(), i,
                run.predicted_ms[i], measured, 100 * (run.predicted_ms[i] / measured - 1),
                run.explore_plan[i] ? " explore" : run.refit_plan[i] ? " refit" : "", run.micro_batches[i],
                run.own_split[i] ? " own" : "");
    if (absl::GetFlag(FLAGS_plan_models)) std::printf("    planned with %s\n", run.plan_model[i].c_str());
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    double plan_ms = 0, k = 0;
    for (int i = 0; i < n; ++i) {
      if (names[i] != jobs[j]) continue;
      plan_ms += run.plan_ms[i];
      ++k;
    }
    std::printf("  %s cost model: %s; planning %.1f ms per iteration\n", jobs[j].c_str(),
                run.models[j].description.c_str(), k > 0 ? plan_ms / k : 0.0);
  }
}

// A row as RunOne and RunTurns print it.
void PrintRow(int round, proto::AttentionKernel::Value kernel, const std::string& m, const Row& row, double first_loss,
              double last_loss) {
  std::printf("%-5d %-12s %-8s %12.0f %12.0f %12.1f %12.1f %8.1f %7.0f%% %9.4f %9.4f %8.1f%% %7.2f\n", round,
              KernelName(kernel), m.c_str(), row.tokens_per_s, row.run_tokens_per_s, row.measured_ms, row.predicted_ms,
              row.micro_batches, 100 * row.padding, first_loss, last_loss, 100 * row.error, row.cpu_s);
}

// One (kernel, method) run of a round, its row printed and kept; returns the exit status.
int RunOne(Bench& b, int round, proto::AttentionKernel::Value kernel, int index) {
  const proto::BatchingSpec::Method method = b.methods[index];
  b.spec.mutable_model()->set_attention(kernel);
  b.spec.mutable_batching()->set_method(method);
  const std::string& m = b.names[index];
  const double cpu_before = ProcessCpuSeconds();
  auto run = cli::RunLocal(b.spec, absl::GetFlag(FLAGS_data_root), b.n);
  const double cpu_s = ProcessCpuSeconds() - cpu_before;
  if (!run.ok()) {
    std::fprintf(stderr, "cpu_throughput: %s: %s\n", m.c_str(), std::string(run.status().message()).c_str());
    return 1;
  }
  Row row = Summarize(*run, b.pp, b.n, b.warmup);
  row.cpu_s = cpu_s;
  b.rows[{kernel, index}].push_back(row);
  if (run->models[0].refit_fitted) b.terms[method] = run->models[0].refit_terms;
  PrintIterations(*run, std::vector<std::string>(b.n, m), {m}, b.warmup);
  PrintRow(round, kernel, m, row, run->per_rank[0].front().loss, run->per_rank[0].back().loss);
  std::fflush(stdout);
  return 0;
}

// One run of a round in which the methods take turns (--turns): a row per
// method over the blocks after the warm-up (its cpu s the whole run's), and
// each block's ratio to packing kept. Returns the exit status.
int RunTurns(Bench& b, int round, proto::AttentionKernel::Value kernel) {
  const int methods = static_cast<int>(b.methods.size()), blocks = b.n / b.turns;
  std::vector<proto::JobSpec> specs;
  for (const auto method : b.methods) {
    proto::JobSpec& spec = specs.emplace_back(b.spec);
    spec.mutable_model()->set_attention(kernel);
    spec.mutable_batching()->set_method(method);
    spec.set_iterations(std::max<int64_t>(spec.iterations(), static_cast<int64_t>(b.n) * methods));
  }
  const std::vector<std::string>& jobs = b.names;
  std::vector<cli::LocalTurn> turns;
  std::vector<std::string> names;
  std::vector<std::vector<Span>> spans(methods);  // [job]: its blocks after the warm-up
  for (int block = 0; block < blocks; ++block) {
    for (int k = 0; k < methods; ++k) {
      const int job = block % 2 == 0 ? k : methods - 1 - k;
      const int begin = static_cast<int>(turns.size());
      for (int i = 0; i < b.turns; ++i) {
        turns.push_back({.job = job, .batch = static_cast<int64_t>(block) * b.turns + i});
        names.push_back(jobs[job]);
      }
      if (block * b.turns >= b.warmup) spans[job].push_back({begin, begin + b.turns});
    }
  }
  const double cpu_before = ProcessCpuSeconds();
  auto run = cli::RunLocalTurns(specs, absl::GetFlag(FLAGS_data_root), turns);
  const double cpu_s = ProcessCpuSeconds() - cpu_before;
  if (!run.ok()) {
    std::fprintf(stderr, "cpu_throughput: --turns: %s\n", std::string(run.status().message()).c_str());
    return 1;
  }
  if (spans[0].empty()) {
    std::fprintf(stderr, "cpu_throughput: --turns: no block after the %d warm-up iterations\n", b.warmup);
    return 2;
  }
  PrintIterations(*run, names, jobs, spans[0].front().begin);
  for (int job = 0; job < methods; ++job) {
    Row row = SummarizeSpans(*run, b.pp, spans[job]);
    row.run_tokens_per_s = 0;  // one run for every method
    row.cpu_s = cpu_s;
    b.rows[{kernel, job}].push_back(row);
    for (size_t block = 0; b.reference >= 0 && job != b.reference && block < spans[job].size(); ++block) {
      const auto seconds = [&](const Span& s) { return run->done_s[s.end - 1] - run->done_s[s.begin - 1]; };
      const Span& theirs = spans[b.reference][block];
      if (theirs.begin == 0 || spans[job][block].begin == 0) continue;  // no end before it to time from
      b.block_ratios[{kernel, job}].push_back(seconds(theirs) / seconds(spans[job][block]));
      for (int i = 0; i < b.turns; ++i) {  // the i-th iteration of either block trains the same batch
        const int ours = spans[job][block].begin + i, ref = theirs.begin + i;
        if (run->explore_plan[ours] || run->explore_plan[ref]) continue;
        const double ratio = MeasuredMs(*run, ref) / MeasuredMs(*run, ours);
        b.same_batch[{kernel, job}][run->micro_batches[ours]].push_back(ratio);
        b.same_batch_origin[{kernel, job}][run->own_split[ours]].push_back(ratio);
      }
      auto& [reference_s, method_s] = b.block_seconds[{kernel, job}];
      reference_s += seconds(theirs);
      method_s += seconds(spans[job][block]);
    }
    const auto first = std::find(names.begin(), names.end(), jobs[job]) - names.begin();
    const auto last = names.rend() - std::find(names.rbegin(), names.rend(), jobs[job]) - 1;
    PrintRow(round, kernel, jobs[job], row, run->per_rank[0][first].loss, run->per_rank[0][last].loss);
  }
  std::fflush(stdout);
  return 0;
}

// Each method's final refit terms pricing the post-warm-up iterations'
// batches as each method splits them (mean predicted ms); returns the exit
// status.
int CrossPrice(const Bench& b, int round, proto::AttentionKernel::Value kernel) {
  if (b.terms.size() < 2) return 0;
  const auto failed = [](const absl::Status& s) {
    std::fprintf(stderr, "cpu_throughput: cross-pricing: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  proto::JobSpec spec = b.spec;
  spec.mutable_model()->set_attention(kernel);
  auto normalized = spec::NormalizedJobSpec::Normalize(spec);
  if (!normalized.ok()) return failed(normalized.status());
  auto rt = planner::service::BuildJobRuntime(*normalized, "cross-price", absl::GetFlag(FLAGS_data_root));
  if (!rt.ok()) return failed(rt.status());
  const planner::Planner& base = *(*rt)->planner;
  planner::PlanRequest request;
  request.build_plans = false;
  request.record = false;
  for (const auto& [priced_by, terms] : b.terms) {
    auto p = planner::Planner::Create(
        base.config(), std::make_shared<planner::RefitCostModel>(base.model().shared_cost_model(), terms));
    if (!p.ok()) return failed(p.status());
    std::printf("%-5d %-12s cross-pricing by %s's refit:", round, KernelName(kernel),
                proto::BatchingSpec::Method_Name(priced_by).c_str());
    for (const auto method : b.methods) {
      const auto batching = planner::BatchingOf(method);
      if (!batching.ok()) return failed(batching.status());
      double ms = 0;
      for (int i = b.warmup; i < b.n; ++i) {
        auto plan = (*p)->Plan((*rt)->batch(i), i, *batching, request);
        if (!plan.ok()) return failed(plan.status());
        ms += plan->predicted_ms / (b.n - b.warmup);
      }
      std::printf(" %s %.1f ms", proto::BatchingSpec::Method_Name(method).c_str(), ms);
    }
    std::printf("\n");
  }
  return 0;
}

// Every (kernel, method) pair once per round; odd rounds run the methods in
// reverse order. Returns the exit status.
int RunRounds(Bench& b) {
  std::printf("%-5s %-12s %-8s %12s %12s %12s %12s %8s %8s %9s %9s %9s %7s\n", "round", "attention", "method", "tokens/s",
              "run tok/s", "measured ms", "predicted ms", "mb/iter", "padding", "loss[0]", "loss[-1]", "pred err", "cpu s");
  for (int round = 0; round < b.rounds; ++round) {
    for (const auto kernel : b.kernels) {
      if (b.turns > 0) {
        if (const int code = RunTurns(b, round, kernel); code != 0) return code;
        continue;
      }
      std::vector<int> order(b.methods.size());
      std::iota(order.begin(), order.end(), 0);
      if (round % 2 == 1) std::reverse(order.begin(), order.end());
      b.terms.clear();
      for (const int index : order) {
        if (const int code = RunOne(b, round, kernel, index); code != 0) return code;
      }
      if (const int code = CrossPrice(b, round, kernel); code != 0) return code;
    }
  }
  return 0;
}

// Packing's time over the method's on the same batches: the median of all,
// then per micro-batch count the method chose (counts under 2% of the
// batches together as "other").
void PrintSameBatch(const std::map<int, std::vector<double>>& by_count) {
  std::vector<double> all, other;
  for (const auto& [count, r] : by_count) all.insert(all.end(), r.begin(), r.end());
  if (all.empty()) return;
  std::printf("%-21s same batches: %.3fx (median of %zu); by its micro-batches:", "", Median(all), all.size());
  for (const auto& [count, r] : by_count) {
    if (50 * r.size() < all.size()) {
      other.insert(other.end(), r.begin(), r.end());
    } else {
      std::printf(" %d %.3fx (%zu)", count, Median(r), r.size());
    }
  }
  if (!other.empty()) std::printf(" other %.3fx (%zu)", Median(other), other.size());
  std::printf("\n");
}

// The same batches split by where the method's split came from (only
// dynamic has splits of its own).
void PrintByOrigin(const std::array<std::vector<double>, 2>& by_own) {
  const std::vector<double>& own = by_own[1];
  const std::vector<double>& baseline = by_own[0];
  if (own.empty()) return;
  std::printf("%-21s by origin: its own splits %.3fx (%zu)", "", Median(own), own.size());
  if (!baseline.empty()) std::printf(", baseline splits %.3fx (%zu)", Median(baseline), baseline.size());
  std::printf("\n");
}

// Medians over the rounds, and the median of the per-round ratios to packing
// (with --turns, of the per-block ratios, and their middle half).
void PrintMedians(Bench& b) {
  std::printf("\nmedians over %d round(s); vs packing = median of the per-%s ratios\n", b.rounds,
              b.turns > 0 ? "block" : "round");
  std::printf("%-12s %-8s %12s %12s %12s %9s %7s %12s\n", "attention", "method", "tokens/s", "measured ms", "predicted ms",
              "pred err", "cpu s", "vs packing");
  for (const auto kernel : b.kernels) {
    const auto packing = b.rows.find({kernel, b.reference});
    for (int index = 0; index < static_cast<int>(b.methods.size()); ++index) {
      const std::vector<Row>& r = b.rows[{kernel, index}];
      std::vector<double> tps, measured, predicted, error, cpu, ratio;
      for (size_t i = 0; i < r.size(); ++i) {
        tps.push_back(r[i].tokens_per_s);
        measured.push_back(r[i].measured_ms);
        predicted.push_back(r[i].predicted_ms);
        error.push_back(r[i].error);
        cpu.push_back(r[i].cpu_s);
        if (packing != b.rows.end()) ratio.push_back(r[i].tokens_per_s / packing->second[i].tokens_per_s);
      }
      const bool blocks = b.turns > 0 && index != b.reference;
      if (blocks) ratio = b.block_ratios[{kernel, index}];
      std::printf("%-12s %-8s %12.0f %12.1f %12.1f %8.1f%% %7.2f", KernelName(kernel), b.names[index].c_str(),
                  Median(tps), Median(measured), Median(predicted),
                  100 * Median(error), Median(cpu));
      if (ratio.empty()) {
        std::printf(" %12s\n", "-");
      } else if (blocks) {
        std::sort(ratio.begin(), ratio.end());
        const auto& [reference_s, method_s] = b.block_seconds[{kernel, index}];
        std::printf(" %11.3fx (middle half %.3f-%.3f of %zu blocks; their summed time %.3fx)\n", Median(ratio),
                    ratio[(ratio.size() - 1) / 4], ratio[3 * (ratio.size() - 1) / 4], ratio.size(),
                    reference_s / method_s);
        PrintSameBatch(b.same_batch[{kernel, index}]);
        PrintByOrigin(b.same_batch_origin[{kernel, index}]);
      } else {
        std::printf(" %11.2fx\n", Median(ratio));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  dynapipe::ParseFlags(argc, argv, "cpu_throughput", "cpu_throughput: trains one job with several batching methods on the CPU backend (ranks as threads) and prints real tokens/s, measured vs predicted iteration time and losses");
  Bench b;
  if (const int code = LoadJob(b); code != 0) return code;
  if (const int code = ParseKernelsAndMethods(b); code != 0) return code;
  if (const int code = RunRounds(b); code != 0) return code;
  PrintMedians(b);
  return 0;
}
