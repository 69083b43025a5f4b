#include "cli/local_run.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "planner/service/job_runtime.h"
#include "runtime/backend/backend.h"
#include "runtime/comm/kv_store.h"
#include "src/common/file_util.h"
#include "src/common/logging.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::cli {
namespace {

// Plans handed from the planning thread to the ranks, and reports back.
class PlanExchange {
 public:
  PlanExchange(int64_t count, int world) : plans_(count), reported_(count), world_(world) {}

  void Publish(int64_t i, std::vector<proto::ExecutionPlan> plans) {
    MutexLock lock(&mu_);
    plans_[i] = std::move(plans);
  }
  // This rank's plan of iteration i; CANCELLED once the run failed.
  absl::StatusOr<proto::ExecutionPlan> Take(int64_t i, int rank) {
    MutexLock lock(&mu_);
    mu_.Await([&] { return plans_[i].has_value() || failed_; });
    if (!plans_[i].has_value()) return absl::CancelledError("local run failed elsewhere");
    return (*plans_[i])[rank];
  }
  void Report(int64_t i, proto::IterationReport report) {
    MutexLock lock(&mu_);
    reported_[i].push_back(std::move(report));
  }
  // Every rank's report of iteration i; empty once the run failed.
  std::vector<proto::IterationReport> AwaitReports(int64_t i) {
    MutexLock lock(&mu_);
    mu_.Await([&] { return static_cast<int>(reported_[i].size()) == world_ || failed_; });
    return failed_ ? std::vector<proto::IterationReport>{} : std::move(reported_[i]);
  }
  void Fail() {
    MutexLock lock(&mu_);
    failed_ = true;
  }

 private:
  Mutex mu_;
  std::vector<std::optional<std::vector<proto::ExecutionPlan>>> plans_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<proto::IterationReport>> reported_ ABSL_GUARDED_BY(mu_);
  const int world_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

proto::IterationReport ReportOf(const runtime::executor::IterationResult& res, int64_t iteration, int rank) {
  proto::IterationReport r;
  r.set_iteration(iteration);
  r.set_rank(rank);
  r.set_iteration_ms(res.iteration_ms);
  r.set_tokens(res.tokens);
  r.set_loss(res.loss);
  for (const auto& t : res.timings) *r.add_timings() = t;
  return r;
}

using planner::service::JobRuntime;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Room for what `out` notes per iteration.
void SizePerIteration(int64_t count, LocalRunResult* out) {
  out->predicted_ms.resize(count);
  out->plan_ms.resize(count);
  out->refit_plan.resize(count);
  out->explore_plan.resize(count);
  out->micro_batches.resize(count);
  out->plan_model.resize(count);
  out->own_split.resize(count);
  out->padding_efficiency.resize(count);
}

// The jobs of a run and whose turn each iteration is.
struct Jobs {
  std::vector<std::shared_ptr<const JobRuntime>> rts;  // [job]
  std::vector<LocalTurn> turns;                        // [iteration]
  const JobRuntime& Of(int64_t i) const { return *rts[turns[i].job]; }
  bool AnyRefit() const {
    return std::any_of(rts.begin(), rts.end(), [](const auto& rt) { return rt->refit != nullptr; });
  }
};

// Plans iteration i, notes it in `out` and hands the plans to the ranks.
// Planning thread only.
absl::Status PlanIteration(const Jobs& jobs, int64_t i, PlanExchange& exchange, LocalRunResult& out) {
  const JobRuntime& rt = jobs.Of(i);
  const std::shared_ptr<const planner::Planner> planner = rt.PlannerFor(i);
  ASSIGN_OR_RETURN(planner::IterationPlan p, planner->Plan(rt.batch(jobs.turns[i].batch), i));
  out.predicted_ms[i] = p.predicted_ms;
  out.plan_ms[i] = p.timings.total_ms;
  out.refit_plan[i] = planner != rt.planner;
  out.explore_plan[i] = rt.refit && rt.refit->PlannedWith(i) == planner::service::PlanModel::kExplore;
  int micro_batches = 0;
  for (const auto& g : p.groups) micro_batches += static_cast<int>(g.size());
  out.micro_batches[i] = micro_batches;
  out.plan_model[i] = planner->model().cost_model().Describe();
  out.own_split[i] = p.own_split;
  out.padding_efficiency[i] = p.padding_efficiency;
  if (rt.refit) rt.refit->Remember(i, p.plans);
  exchange.Publish(i, std::move(p.plans));
  return absl::OkStatus();
}

// What the rank threads share. Each rank writes only its own slots of
// out->per_rank, out->final_params, wall and done.
struct Ranks {
  const JobRuntime& rt;
  data::Dataset* dataset;
  runtime::comm::MemoryKeyValueStore* kv;
  PlanExchange* exchange;
  const runtime::executor::WorkerOptions& options;
  const runtime::BackendOptions& backend_options;
  int64_t count;
  std::string export_dir;  // export_dir under the data root; empty: none
  LocalRunResult* out;
  std::vector<double> wall;               // per rank: its iterations' seconds
  std::vector<std::vector<double>> done;  // [rank][iteration]: seconds since `start`, on one clock for every rank
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

// The final parameters of a worker's chunks, concatenated.
absl::Status ExportParams(const runtime::executor::Worker& worker, std::vector<float>* params) {
  for (const auto& c : worker.chunks()) {
    runtime::model::StageState state;
    RETURN_IF_ERROR(c->ExportState(&state));
    params->insert(params->end(), state.params.begin(), state.params.end());
  }
  return absl::OkStatus();
}

// Rank r's thread: every iteration on a backend of its own (as one per
// executor process), each reported to the exchange.
absl::Status RunRank(Ranks& ranks, int r) {
  const JobRuntime& rt = ranks.rt;
  const int world = rt.world();
  const int pp = rt.planner->config().pp, dp = rt.planner->config().dp;
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend, CreateBackend(ranks.backend_options));
  RETURN_IF_ERROR(backend->BindThread());
  ASSIGN_OR_RETURN(auto comm, backend->Connect({.rank = r, .size = world, .job_prefix = "local/"}, ranks.kv));
  ASSIGN_OR_RETURN(proto::ExecutionPlan first, ranks.exchange->Take(0, r));
  const auto& layers = first.layers();
  ASSIGN_OR_RETURN(auto worker, runtime::executor::Worker::Create(
                                    rt.spec, std::vector<int32_t>(layers.begin(), layers.end()), r, pp, dp, comm.get(),
                                    ranks.dataset, backend.get(), ranks.options));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < ranks.count; ++i) {
    ASSIGN_OR_RETURN(proto::ExecutionPlan p, i == 0 ? std::move(first) : ranks.exchange->Take(i, r));
    ASSIGN_OR_RETURN(runtime::executor::IterationResult res, worker->RunIteration(p));
    ranks.done[r][i] = SecondsSince(ranks.start);
    ranks.exchange->Report(i, ReportOf(res, i, r));
    ranks.out->per_rank[r].push_back(std::move(res));
    if (i + 1 == rt.spec->iterations() && !ranks.export_dir.empty()) {
      RETURN_IF_ERROR(worker->ExportHuggingFace(ranks.export_dir));
    }
  }
  ranks.wall[r] = SecondsSince(t0);
  return ExportParams(*worker, &ranks.out->final_params[r]);
}

// With the refit on, while the ranks run: iteration i + ahead is planned once
// every rank has reported iteration i and the refit of i's job has seen it.
absl::Status PlanAsReported(const Jobs& jobs, int64_t ahead, PlanExchange& exchange, LocalRunResult& out) {
  absl::Status planning = absl::OkStatus();
  const auto count = static_cast<int64_t>(jobs.turns.size());
  const bool any_refit = jobs.AnyRefit();
  for (int64_t i = 0; any_refit && i < count && planning.ok(); ++i) {
    const std::vector<proto::IterationReport> reports = exchange.AwaitReports(i);
    if (reports.empty()) break;  // a rank failed: its status says why
    if (const auto& refit = jobs.Of(i).refit) {
      for (const auto& r : reports) {
        if (const absl::Status s = refit->Report(r); !s.ok()) spdlog::warn("cost refit: {}", s.message());
      }
    }
    if (i + ahead < count) planning = PlanIteration(jobs, i + ahead, exchange, out);
    if (!planning.ok()) exchange.Fail();
  }
  return planning;
}

// The run's times (the slowest rank's) and the cost models its jobs ended with.
void NoteTimesAndModels(const Jobs& jobs, const Ranks& ranks, LocalRunResult* out) {
  out->wall_s = *std::max_element(ranks.wall.begin(), ranks.wall.end());
  out->done_s.assign(ranks.count, 0);
  for (const auto& rank_done : ranks.done) {
    for (int64_t i = 0; i < ranks.count; ++i) out->done_s[i] = std::max(out->done_s[i], rank_done[i]);
  }
  for (const auto& rt : jobs.rts) {
    LocalJobModel& m = out->models.emplace_back();
    // The model later iterations would be planned with (PlannerFor would also note an iteration that never runs).
    m.description = rt->refit ? rt->refit->Status().model : rt->planner->model().cost_model().Describe();
    if (rt->refit) {
      const planner::service::RefitStatus refit = rt->refit->Status();
      m.refit_fitted = refit.refits > 0;
      m.refit_terms = refit.terms;
      m.refit_observed = refit.observed;
    }
  }
}

// The specs with what the jobs of a run in turns may differ in cleared:
// INVALID_ARGUMENT unless they are all alike.
absl::Status CheckTurnsAlike(const std::vector<proto::JobSpec>& specs) {
  const auto shared = [](proto::JobSpec s) {
    s.clear_batching();
    s.clear_cost_refit();
    return s.SerializeAsString();
  };
  for (size_t j = 1; j < specs.size(); ++j) {
    if (shared(specs[j]) != shared(specs[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat("jobs taking turns differ in more than batching and cost_refit: job ", j, " and job 0"));
    }
  }
  return absl::OkStatus();
}

// Runs the jobs' turns on ranks made from the first job's spec (exporting as
// it asks when `export_at_end`).
absl::StatusOr<LocalRunResult> Run(Jobs jobs, const std::string& data_root, bool export_at_end,
                                   runtime::executor::WorkerOptions options,
                                   const runtime::BackendOptions& backend_options) {
  const JobRuntime& rt = *jobs.rts[0];
  ASSIGN_OR_RETURN(const spec::JobPaths paths, spec::ConfineJobPaths(rt.spec, data_root));
  ASSIGN_OR_RETURN(std::unique_ptr<data::Dataset> dataset, data::Dataset::Open(paths.dataset));
  if (options.init_from.empty()) options.init_from = paths.init_from;
  const int world = rt.world();
  const auto count = static_cast<int64_t>(jobs.turns.size());
  LocalRunResult out;
  SizePerIteration(count, &out);
  PlanExchange exchange(count, world);
  const int64_t ahead = jobs.AnyRefit() ? std::min<int64_t>(count, rt.spec->planner_lookahead()) : count;
  for (int64_t i = 0; i < ahead; ++i) RETURN_IF_ERROR(PlanIteration(jobs, i, exchange, out));
  if (count == 0) return out;

  runtime::comm::MemoryKeyValueStore kv;
  out.per_rank.resize(world);
  out.final_params.resize(world);
  std::vector<absl::Status> status(world);
  std::vector<std::thread> threads;
  Ranks ranks{rt, dataset.get(), &kv, &exchange, options, backend_options, count,
              export_at_end ? paths.export_dir : "", &out,
              std::vector<double>(world, 0), std::vector<std::vector<double>>(world, std::vector<double>(count, 0))};
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      status[r] = RunRank(ranks, r);
      if (!status[r].ok()) exchange.Fail();
    });
  }
  const absl::Status planning = PlanAsReported(jobs, ahead, exchange, out);
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(planning);
  for (int r = 0; r < world; ++r) RETURN_IF_ERROR(status[r]);
  NoteTimesAndModels(jobs, ranks, &out);
  return out;
}

}  // namespace

absl::StatusOr<LocalRunResult> RunLocal(const proto::JobSpec& spec, const std::string& data_root, int64_t count,
                                        runtime::executor::WorkerOptions options, runtime::BackendOptions backend_options) {
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::NormalizedJobSpec::Normalize(spec));
  return RunLocal(normalized, data_root, count, std::move(options), std::move(backend_options));
}

absl::StatusOr<LocalRunResult> RunLocal(const spec::NormalizedJobSpec& spec, const std::string& data_root,
                                        int64_t count, runtime::executor::WorkerOptions options,
                                        runtime::BackendOptions backend_options) {
  Jobs jobs;
  ASSIGN_OR_RETURN(auto rt, planner::service::BuildJobRuntime(spec, "local", data_root));
  jobs.rts.push_back(std::move(rt));
  for (int64_t i = 0; i < count; ++i) jobs.turns.push_back({.job = 0, .batch = i});
  return Run(std::move(jobs), data_root, /*export_at_end=*/true, std::move(options), backend_options);
}

absl::StatusOr<LocalRunResult> RunLocalTurns(const std::vector<proto::JobSpec>& specs, const std::string& data_root,
                                             const std::vector<LocalTurn>& turns,
                                             runtime::executor::WorkerOptions options,
                                             runtime::BackendOptions backend_options) {
  if (specs.empty()) return absl::InvalidArgumentError("a run in turns needs at least one job");
  RETURN_IF_ERROR(CheckTurnsAlike(specs));
  Jobs jobs;
  for (const proto::JobSpec& s : specs) {
    ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::NormalizedJobSpec::Normalize(s));
    ASSIGN_OR_RETURN(auto rt, planner::service::BuildJobRuntime(normalized, absl::StrCat("local-", jobs.rts.size()),
                                                                 data_root));
    jobs.rts.push_back(std::move(rt));
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].job < 0 || turns[i].job >= static_cast<int>(specs.size()) || turns[i].batch < 0) {
      return absl::InvalidArgumentError(absl::StrCat("turn ", i, ": job ", turns[i].job, " batch ", turns[i].batch,
                                                     " (", specs.size(), " jobs)"));
    }
  }
  jobs.turns = turns;
  return Run(std::move(jobs), data_root, /*export_at_end=*/false, std::move(options), backend_options);
}

}  // namespace dynapipe::cli
