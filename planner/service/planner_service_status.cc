// PlannerService: the status endpoint (/healthz, /status, /metrics).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/service/planner_service.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {
namespace {

std::string Json(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Plans stored ahead of a job's training.
int64_t PlansAhead(const proto::JobStatus& s) {
  return std::max<int64_t>(0, s.plans_ready() + 1 - s.iterations_done());
}

}  // namespace

// ---- Status ----

std::string PlannerService::HealthProblem() const {
  if (!store_->healthy()) return "plan store (Redis) unreachable";
  return "";
}

std::string PlannerService::RefitJson(const std::string& job) {
  const std::shared_ptr<const JobRuntime> rt = runtimes_.Loaded(job);
  if (!rt || !rt->refit) return "";
  const RefitStatus st = rt->refit->Status();
  std::vector<std::string> recent;
  constexpr size_t kShown = 10;
  for (size_t i = st.recent.size() > kShown ? st.recent.size() - kShown : 0; i < st.recent.size(); ++i) {
    const RefitIteration& h = st.recent[i];
    recent.push_back(absl::StrFormat(
        "{\"iteration\":%d,\"predicted_ms\":%.3f,\"measured_ms\":%.3f,\"refit_plan\":%s,\"explore\":%s}", h.iteration,
        h.predicted_ms, h.measured_ms, h.refit_plan ? "true" : "false", h.explore ? "true" : "false"));
  }
  return absl::StrFormat(
      ",\"refit\":{\"observed\":%d,\"refits\":%d,\"outliers\":%d,\"model\":%s,\"base_error\":%.4f,"
      "\"refit_error\":%.4f,\"micro_batch_fw_ms\":%.4f,\"micro_batch_bw_ms\":%.4f,\"iteration_ms\":%.3f,"
      "\"recent\":[%s]}",
      st.observed, st.refits, st.outliers, Json(st.model), st.base_error, st.refit_error,
      st.terms.fw.micro_batch_ms + st.terms.dispatch_fw_ms, st.terms.bw.micro_batch_ms + st.terms.dispatch_bw_ms,
      st.terms.iteration_ms, absl::StrJoin(recent, ","));
}

PlannerService::Snapshot PlannerService::StatusSnapshot() {
  absl::StatusOr<Snapshot> snap = AnswerWithinSync<Snapshot>(
      WithinOptions(),
      [this]() -> absl::StatusOr<Snapshot> {
        Snapshot s;
        ASSIGN_OR_RETURN(s.jobs, ReadJobs());
        ASSIGN_OR_RETURN(s.executors, registry_.Executors());
        return s;
      },
      [this](const absl::Status&) -> absl::StatusOr<Snapshot> {
        // Whatever is known, however old (nothing at all before the first read).
        Snapshot s;
        LastKnown::Jobs jobs = last_known_.AllJobs();
        LastKnown::Executors executors = last_known_.AllExecutors();
        s.jobs = std::move(jobs.jobs);
        s.executors = std::move(executors.executors);
        const absl::Time at = std::min(jobs.at, executors.at);
        s.stale_ms = at == absl::InfinitePast() ? absl::ToInt64Milliseconds(options_.clock->Now() - started_) + 1
                                                : StaleMs(at);
        return s;
      });
  return snap.ok() ? std::move(*snap) : Snapshot{};
}

std::string PlannerService::StatusJson() {
  const Snapshot snap = StatusSnapshot();
  std::vector<std::string> jobs, executors;
  // Every active job; of the ended ones the newest kStatusEndedJobs (job ids
  // grow with submission), so the page stays small on a long-lived planner.
  std::vector<const proto::JobStatus*> shown, ended;
  for (const proto::JobStatus& s : snap.jobs) (store::IsTerminal(s.state()) ? ended : shown).push_back(&s);
  auto newer = [](const proto::JobStatus* a, const proto::JobStatus* b) {
    return a->job_id().size() != b->job_id().size() ? a->job_id().size() > b->job_id().size()
                                                    : a->job_id() > b->job_id();
  };
  const size_t keep = std::min(ended.size(), kStatusEndedJobs);
  std::partial_sort(ended.begin(), ended.begin() + keep, ended.end(), newer);
  const size_t ended_omitted = ended.size() - keep;
  shown.insert(shown.end(), ended.begin(), ended.begin() + keep);
  for (const proto::JobStatus* job : shown) {
    const proto::JobStatus& s = *job;
    const std::string& id = s.job_id();
    jobs.push_back(absl::StrFormat(
        "{\"job_id\":%s,\"name\":%s,\"state\":%s,\"iterations\":%d,\"iterations_done\":%d,\"plans_ready\":%d,"
        "\"plans_ahead\":%d,\"last_iteration_ms\":%.3f,\"predicted_iteration_ms\":%.3f,\"error\":%s%s}",
        Json(id), Json(s.spec().name()), Json(proto::JobState::Value_Name(s.state())), s.spec().iterations(),
        s.iterations_done(), s.plans_ready(), PlansAhead(s), s.last_iteration_ms(), s.predicted_iteration_ms(),
        Json(s.error()), RefitJson(id)));
  }
  const int64_t now = NowMs();
  for (const auto& r : snap.executors) {
    executors.push_back(absl::StrFormat(
        "{\"executor_id\":%s,\"node\":%s,\"device\":%d,\"last_heartbeat_ms_ago\":%d,\"lost\":%s,\"job_id\":%s,"
        "\"rank\":%d}",
        Json(r.executor_id()), Json(r.info().node()), r.info().device_index(), now - r.last_heartbeat_unix_ms(),
        r.lost() ? "true" : "false", Json(r.assignment().job_id()),
        r.assignment().job_id().empty() ? -1 : r.assignment().rank()));
  }
  std::string store_id;
  int64_t store_losses;
  {
    MutexLock lock(&store_id_mu_);
    store_id = store_id_;
    store_losses = store_losses_;
  }
  // "stale_ms" > 0: the store did not answer in time; jobs and executors are
  // the last known state, that old.
  return absl::StrFormat("{\"daemon\":\"dynapipe-planner\",\"owner\":%s,\"healthy\":%s,\"redis_errors\":%d,"
                         "\"store_id\":%s,\"store_data_lost\":%d,\"stale_ms\":%d,\"notice\":%s,\"jobs\":[%s],"
                         "\"ended_jobs_not_shown\":%d,\"executors\":[%s]}",
                         Json(options_.owner), HealthProblem().empty() ? "true" : "false", store_->errors(),
                         Json(store_id), store_losses, snap.stale_ms, Json(LossNotice()), absl::StrJoin(jobs, ","),
                         ended_omitted, absl::StrJoin(executors, ","));
}

namespace {

// Training FLOPs per token by the usual estimate: 6 x the parameters a token
// passes through (transformer layers and the LM head; embedding lookups and
// attention scores left out).
double FlopsPerToken(const PipelineModel& pm) {
  double params_m = 0;
  for (const Chunk& c : pm.chunks()) {
    for (const auto& [kind, n] : LayerCounts(c)) {
      if (kind != LayerKind::kEmbedding) params_m += n * pm.cost_model().ParamsMillions(kind);
    }
  }
  return 6e6 * params_m;
}

}  // namespace

void PlannerService::JobMetrics(const proto::JobStatus& s) {
  const std::string& id = s.job_id();
  const http::Labels job = {{"job", id}};
  metrics_.Set("dynapipe_job_iterations", static_cast<double>(s.spec().iterations()), "Iterations a job trains",
               job);
  metrics_.Set("dynapipe_job_iterations_completed", static_cast<double>(s.iterations_done()),
               "Iterations every rank of a job reported", job);
  metrics_.Set("dynapipe_job_plans_ahead", PlansAhead(s), "Plans stored ahead of a job's training", job);
  if (s.iterations_done() <= s.start_iteration()) return;
  // What status shows (FillLastIteration): the last completed iteration,
  // tokens/s over up to 20 of them.
  const int pp = std::max(1, s.spec().parallelism().pp()), dp = std::max(1, s.spec().parallelism().dp());
  metrics_.Set("dynapipe_job_loss", s.last_loss(), "Training loss of a job's last completed iteration", job);
  metrics_.Set("dynapipe_job_iteration_seconds", s.last_iteration_ms() / 1e3,
               "Measured time of a job's last completed iteration (the slowest rank)", job);
  metrics_.Set("dynapipe_job_predicted_iteration_seconds", s.predicted_iteration_ms() / 1e3,
               "The planner's prediction for a job's last completed iteration", job);
  const double tokens_per_s = s.tokens_per_second();
  if (tokens_per_s <= 0) return;
  metrics_.Set("dynapipe_job_tokens_per_second", tokens_per_s,
               "Real (non-padding) tokens per second over a job's last 20 completed iterations", job);
  const std::shared_ptr<const JobRuntime> rt = runtimes_.Loaded(id);
  const double peak = s.spec().cluster().device().peak_tflops() * 1e12 * pp * dp;
  if (rt && peak > 0) {
    metrics_.Set("dynapipe_job_model_flops_utilization", tokens_per_s * FlopsPerToken(rt->planner->model()) / peak,
                 "Model FLOPs utilization over a job's last 20 completed iterations: 6 x parameters x tokens/s over "
                 "the devices' peak (cluster.device.peak_tflops x ranks)",
                 job);
  }
}

std::string PlannerService::MetricsText() {
  // One scrape at a time: the per-job series are rebuilt below.
  MutexLock scrape(&metrics_text_mu_);
  int running = 0;
  int64_t min_ahead = -1;
  const Snapshot snap = StatusSnapshot();
  for (const proto::JobStatus& s : snap.jobs) {
    if (store::IsTerminal(s.state())) {
      metrics_.ClearAll({{"job", s.job_id()}});  // series exist while the job is active
      continue;
    }
    running += s.state() == proto::JobState::running;
    const int64_t ahead = PlansAhead(s);
    min_ahead = min_ahead < 0 ? ahead : std::min(min_ahead, ahead);
    JobMetrics(s);
  }
  metrics_.Set("dynapipe_state_stale_seconds", snap.stale_ms / 1e3,
               "0 when the plan store answered this scrape; else the age of the last known state it shows");
  metrics_.Set("dynapipe_jobs_running", running, "Jobs in state running");
  metrics_.Set("dynapipe_plans_ahead_min", std::max<int64_t>(0, min_ahead),
               "Smallest number of stored plans ahead of training over active jobs");
  metrics_.Set("dynapipe_jobs_loaded", static_cast<double>(runtimes_.size()),
               "Jobs whose planner and global batches this process holds in memory");
  metrics_.SetTotal("dynapipe_redis_errors_total", static_cast<double>(store_->errors()),
                    "Failed Redis commands since start");
  metrics_.Set("dynapipe_redis_healthy", store_->healthy() ? 1 : 0, "1 when the last Redis command succeeded");
  {
    MutexLock lock(&store_id_mu_);
    metrics_.SetTotal("dynapipe_store_data_lost_total", static_cast<double>(store_losses_),
                      "Times this planner found the plan store's data gone (Redis restarted empty or flushed)");
  }
  return metrics_.Render() + http::ProcessMetricsText("dynapipe");
}

}  // namespace dynapipe::planner::service
