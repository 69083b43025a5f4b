#include "planner/service/status_view.h"

#include <algorithm>

#include "planner/cost_model/pipeline_model.h"
#include "src/store/plan_store.h"

namespace dynapipe::planner::service {
namespace {

// Plans stored ahead of a job's training.
int64_t PlansAhead(const proto::JobStatus& s) {
  return std::max<int64_t>(0, s.plans_ready() + 1 - s.iterations_done());
}

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

void StatusView::RefitJson(const std::string& job, JsonWriter& w) const {
  const std::shared_ptr<const JobRuntime> rt = runtimes_->Loaded(job);
  if (!rt || !rt->refit) return;
  const RefitStatus st = rt->refit->Status();
  w.Key("refit").BeginObject().Int("observed", st.observed).Int("refits", st.refits).Int("outliers", st.outliers);
  w.Str("model", st.model).Fixed("base_error", st.base_error, 4).Fixed("refit_error", st.refit_error, 4);
  w.Fixed("micro_batch_fw_ms", st.terms.fw.micro_batch_ms + st.terms.dispatch_fw_ms, 4);
  w.Fixed("micro_batch_bw_ms", st.terms.bw.micro_batch_ms + st.terms.dispatch_bw_ms, 4);
  w.Fixed("iteration_ms", st.terms.iteration_ms, 3).Key("recent").BeginArray();
  constexpr size_t kShown = 10;
  for (size_t i = st.recent.size() > kShown ? st.recent.size() - kShown : 0; i < st.recent.size(); ++i) {
    const RefitIteration& h = st.recent[i];
    w.BeginObject().Int("iteration", h.iteration).Fixed("predicted_ms", h.predicted_ms, 3);
    w.Fixed("measured_ms", h.measured_ms, 3).Bool("refit_plan", h.refit_plan).Bool("explore", h.explore).EndObject();
  }
  w.EndArray().EndObject();
}

void StatusView::JobJson(const proto::JobStatus& s, JsonWriter& w) const {
  w.BeginObject().Str("job_id", s.job_id()).Str("name", s.spec().name());
  w.Str("state", proto::JobState::Value_Name(s.state())).Int("iterations", s.spec().iterations());
  w.Int("iterations_done", s.iterations_done()).Int("plans_ready", s.plans_ready()).Int("plans_ahead", PlansAhead(s));
  w.Fixed("last_iteration_ms", s.last_iteration_ms(), 3).Fixed("predicted_iteration_ms", s.predicted_iteration_ms(), 3);
  w.Str("error", s.error());
  RefitJson(s.job_id(), w);
  w.EndObject();
}

std::string StatusView::Json(const StatusInputs& in) const {
  // Every active job; of the ended ones the newest kEndedJobs (job ids grow
  // with submission), so the page stays small on a long-lived planner.
  std::vector<const proto::JobStatus*> shown, ended;
  for (const proto::JobStatus& s : in.jobs) (store::IsTerminal(s.state()) ? ended : shown).push_back(&s);
  auto newer = [](const proto::JobStatus* a, const proto::JobStatus* b) {
    return a->job_id().size() != b->job_id().size() ? a->job_id().size() > b->job_id().size()
                                                    : a->job_id() > b->job_id();
  };
  const size_t keep = std::min(ended.size(), kEndedJobs);
  std::partial_sort(ended.begin(), ended.begin() + keep, ended.end(), newer);
  shown.insert(shown.end(), ended.begin(), ended.begin() + keep);
  JsonWriter w;
  // "stale_ms" > 0: the store did not answer in time; jobs and executors are
  // the last known state, that old.
  w.BeginObject().Str("daemon", "dynapipe-planner").Str("owner", in.owner).Bool("healthy", in.healthy);
  w.Int("redis_errors", in.redis_errors).Str("store_id", in.store_id).Int("store_data_lost", in.store_losses);
  w.Int("stale_ms", in.stale_ms).Str("notice", in.notice).Key("jobs").BeginArray();
  for (const proto::JobStatus* job : shown) JobJson(*job, w);
  w.EndArray().Int("ended_jobs_not_shown", static_cast<int64_t>(ended.size() - keep)).Key("executors").BeginArray();
  for (const auto& r : in.executors) {
    w.BeginObject().Str("executor_id", r.executor_id()).Str("node", r.info().node());
    w.Int("device", r.info().device_index()).Int("last_heartbeat_ms_ago", in.now_ms - r.last_heartbeat_unix_ms());
    w.Bool("lost", r.lost()).Str("job_id", r.assignment().job_id());
    w.Int("rank", r.assignment().job_id().empty() ? -1 : r.assignment().rank()).EndObject();
  }
  w.EndArray().EndObject();
  return w.Take();
}

void StatusView::JobMetrics(const proto::JobStatus& s) {
  const std::string& id = s.job_id();
  const http::Labels job = {{"job", id}};
  metrics_->Set("dynapipe_job_iterations", static_cast<double>(s.spec().iterations()), "Iterations a job trains",
               job);
  metrics_->Set("dynapipe_job_iterations_completed", static_cast<double>(s.iterations_done()),
               "Iterations every rank of a job reported", job);
  metrics_->Set("dynapipe_job_plans_ahead", PlansAhead(s), "Plans stored ahead of a job's training", job);
  if (s.iterations_done() <= s.start_iteration()) return;
  // What status shows (FillLastIteration): the last completed iteration,
  // tokens/s over up to 20 of them.
  const int pp = std::max(1, s.spec().parallelism().pp()), dp = std::max(1, s.spec().parallelism().dp());
  metrics_->Set("dynapipe_job_loss", s.last_loss(), "Training loss of a job's last completed iteration", job);
  metrics_->Set("dynapipe_job_iteration_seconds", s.last_iteration_ms() / 1e3,
               "Measured time of a job's last completed iteration (the slowest rank)", job);
  metrics_->Set("dynapipe_job_predicted_iteration_seconds", s.predicted_iteration_ms() / 1e3,
               "The planner's prediction for a job's last completed iteration", job);
  const double tokens_per_s = s.tokens_per_second();
  if (tokens_per_s <= 0) return;
  metrics_->Set("dynapipe_job_tokens_per_second", tokens_per_s,
               "Real (non-padding) tokens per second over a job's last 20 completed iterations", job);
  const std::shared_ptr<const JobRuntime> rt = runtimes_->Loaded(id);
  const double peak = s.spec().cluster().device().peak_tflops() * 1e12 * pp * dp;
  if (rt && peak > 0) {
    metrics_->Set("dynapipe_job_model_flops_utilization", tokens_per_s * FlopsPerToken(rt->planner->model()) / peak,
                 "Model FLOPs utilization over a job's last 20 completed iterations: 6 x parameters x tokens/s over "
                 "the devices' peak (cluster.device.peak_tflops x ranks)",
                 job);
  }
}

std::string StatusView::MetricsText(const StatusInputs& in) {
  // One scrape at a time: the per-job series are rebuilt below.
  MutexLock scrape(&scrape_mu_);
  int running = 0;
  int64_t min_ahead = -1;
  for (const proto::JobStatus& s : in.jobs) {
    if (store::IsTerminal(s.state())) {
      metrics_->ClearAll({{"job", s.job_id()}});  // series exist while the job is active
      continue;
    }
    running += s.state() == proto::JobState::running;
    const int64_t ahead = PlansAhead(s);
    min_ahead = min_ahead < 0 ? ahead : std::min(min_ahead, ahead);
    JobMetrics(s);
  }
  metrics_->Set("dynapipe_state_stale_seconds", in.stale_ms / 1e3,
                "0 when the plan store answered this scrape; else the age of the last known state it shows");
  metrics_->Set("dynapipe_jobs_running", running, "Jobs in state running");
  metrics_->Set("dynapipe_plans_ahead_min", std::max<int64_t>(0, min_ahead),
                "Smallest number of stored plans ahead of training over active jobs");
  metrics_->Set("dynapipe_jobs_loaded", static_cast<double>(runtimes_->size()),
                "Jobs whose planner and global batches this process holds in memory");
  metrics_->SetTotal("dynapipe_redis_errors_total", static_cast<double>(in.redis_errors),
                     "Failed Redis commands since start");
  metrics_->Set("dynapipe_redis_healthy", in.healthy ? 1 : 0, "1 when the last Redis command succeeded");
  metrics_->SetTotal("dynapipe_store_data_lost_total", static_cast<double>(in.store_losses),
                     "Times this planner found the plan store's data gone (Redis restarted empty or flushed)");
  return metrics_->Render() + http::ProcessMetricsText("dynapipe");
}

}  // namespace dynapipe::planner::service
