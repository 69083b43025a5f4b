// PlannerService: the jobs' per-iteration history, what status shows of it,
// and one iteration's plans and reports for traces.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "planner/service/planner_service.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {
namespace {

// What every rank reports alike (executors learn the global loss and norm),
// taken from rank 0's report.
void TakeGlobal(const proto::IterationReport& rank0, proto::IterationSummary* s) {
  s->set_loss(rank0.loss());
  s->set_predicted_iteration_ms(rank0.predicted_iteration_ms());
  s->set_lr(rank0.lr());
  s->set_grad_norm(rank0.grad_norm());
}

}  // namespace

void PlannerService::FillLastIteration(proto::JobStatus* s) {
  // The history's last iterations every rank finished.
  constexpr int kWindow = 20;
  if (s->iterations_done() <= s->start_iteration()) return;
  auto h = store_->History(s->job_id(), std::max(s->start_iteration(), s->iterations_done() - kWindow), kWindow);
  if (!h.ok()) return;
  // The report that completed the last iteration wakes watchers before its
  // history entry is written: that iteration then comes from rank 0's report.
  const int64_t last_done = s->iterations_done() - 1;
  if (h->empty() || h->back().iteration() != last_done) {
    auto r = store_->GetReport(s->job_id(), last_done, 0);
    if (!r.ok()) return;
    proto::IterationSummary& latest = h->emplace_back();
    latest.set_iteration(last_done);
    TakeGlobal(*r, &latest);
    latest.set_iteration_ms(r->iteration_ms());
    latest.set_tokens(r->tokens() * std::max(1, s->spec().parallelism().dp()));  // rank 0's group, times the groups
  }
  const proto::IterationSummary& last = h->back();
  s->set_last_loss(last.loss());
  s->set_last_iteration_ms(last.iteration_ms());
  s->set_predicted_iteration_ms(last.predicted_iteration_ms());
  s->set_lr(last.lr());
  s->set_grad_norm(last.grad_norm());
  double loss = 0, ms = 0, tokens = 0;
  for (const proto::IterationSummary& i : *h) {
    loss += i.loss();
    ms += i.iteration_ms();
    tokens += static_cast<double>(i.tokens());
  }
  const double n = static_cast<double>(h->size());
  s->set_smoothed_loss(loss / n);
  if (ms > 0) s->set_tokens_per_second(tokens / (ms / 1e3));
  if (!store::IsTerminal(s->state())) {
    s->set_eta_s(static_cast<double>(s->spec().iterations() - s->iterations_done()) * ms / n / 1e3);
  }
}

void PlannerService::RecordHistory(const proto::JobStatus& job, int64_t iteration) {
  const int world = store::WorldSize(job.spec()), pp = std::max(1, job.spec().parallelism().pp());
  proto::IterationSummary s;
  s.set_iteration(iteration);
  for (int r = 0; r < world; ++r) {
    auto report = store_->GetReport(job.job_id(), iteration, r);
    if (!report.ok()) {
      spdlog::warn("job {} iteration {}: no history entry: {}", job.job_id(), iteration, report.status().message());
      return;
    }
    if (r == 0) TakeGlobal(*report, &s);
    if (r % pp == 0) s.set_tokens(s.tokens() + report->tokens());  // first stage of its data-parallel group
    s.set_iteration_ms(std::max(s.iteration_ms(), report->iteration_ms()));
    s.set_peak_memory_mb(std::max(s.peak_memory_mb(), report->peak_memory_mb()));
  }
  s.set_done_unix_ms(NowMs());
  if (absl::Status st = store_->PutHistory(job.job_id(), s); !st.ok()) {
    spdlog::warn("job {} iteration {}: history not kept: {}", job.job_id(), iteration, st.message());
  }
}

absl::StatusOr<proto::GetIterationsResponse> PlannerService::GetIterations(const proto::GetIterationsRequest& req) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: must be set");
  if (req.limit() < 0 || req.limit() > store::PlanStore::kHistoryLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", req.limit(), " is outside 0..", store::PlanStore::kHistoryLimit));
  }
  RETURN_IF_ERROR(store_->GetJob(req.job_id()).status());
  ASSIGN_OR_RETURN(auto history,
                   store_->History(req.job_id(), req.from_iteration(), req.limit() > 0 ? req.limit() : 1000));
  proto::GetIterationsResponse resp;
  for (auto& s : history) *resp.add_iterations() = std::move(s);
  return resp;
}

absl::StatusOr<proto::GetIterationResponse> PlannerService::GetIteration(const proto::GetIterationRequest& req) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: must be set");
  ASSIGN_OR_RETURN(const proto::JobStatus s, store_->GetJob(req.job_id()));
  if (req.iteration() < s.start_iteration() || req.iteration() >= s.spec().iterations()) {
    return absl::InvalidArgumentError(absl::StrCat("iteration: ", req.iteration(), " is outside job ", req.job_id(),
                                                   " (", s.start_iteration(), "..", s.spec().iterations() - 1, ")"));
  }
  proto::GetIterationResponse resp;
  const int world = store::WorldSize(s.spec());
  for (int r = 0; r < world; ++r) {
    auto plan = store_->GetPlan(req.job_id(), req.iteration(), r);
    auto report = store_->GetReport(req.job_id(), req.iteration(), r);
    if (!plan.ok() || !report.ok()) {
      const absl::Status& why = plan.ok() ? report.status() : plan.status();
      if (why.code() != absl::StatusCode::kNotFound) return why;
      return absl::NotFoundError(absl::StrCat("iteration ", req.iteration(), " of job ", req.job_id(),
                                              ": rank ", r, "'s ", plan.ok() ? "report" : "plan",
                                              " is not stored (not run yet, or older than ",
                                              absl::FormatDuration(options_.plan_ttl), ", how long they are kept)"));
    }
    *resp.add_plans() = std::move(*plan);
    *resp.add_reports() = std::move(*report);
  }
  return resp;
}

}  // namespace dynapipe::planner::service
