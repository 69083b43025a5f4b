#include "src/rpc/planner_client.h"

#include "absl/strings/str_cat.h"

#include "absl/time/clock.h"
#include "src/common/status_macros.h"
#include "src/rpc/status_conversion.h"

namespace dynapipe::rpc {

absl::StatusOr<std::unique_ptr<PlannerClient>> PlannerClient::Connect(Options options) {
  std::unique_ptr<PlannerClient> c(new PlannerClient(std::move(options)));
  ASSIGN_OR_RETURN(c->channel_, MakeChannel(c->options_.address, c->options_.tls));
  c->jobs_ = proto::JobService::NewStub(c->channel_);
  c->plans_ = proto::PlanService::NewStub(c->channel_);
  c->registry_ = proto::ExecutorRegistry::NewStub(c->channel_);
  c->bootstrap_ = proto::Bootstrap::NewStub(c->channel_);
  if (c->options_.connect_timeout > absl::ZeroDuration() &&
      !c->channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + c->options_.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot reach the planner at ", c->options_.address, " within ",
                                               absl::FormatDuration(c->options_.connect_timeout)));
  }
  return c;
}

namespace {
absl::Status ShutDownError() { return absl::CancelledError("the planner client is shutting down"); }
}  // namespace

bool PlannerClient::Track(grpc::ClientContext* context) {
  MutexLock lock(&mu_);
  if (shut_down_) return false;
  in_flight_.insert(context);
  return true;
}

void PlannerClient::Untrack(grpc::ClientContext* context) {
  MutexLock lock(&mu_);
  in_flight_.erase(context);
}

void PlannerClient::Shutdown() {
  MutexLock lock(&mu_);
  shut_down_ = true;
  for (grpc::ClientContext* c : in_flight_) c->TryCancel();
}

bool PlannerClient::shut_down() const {
  MutexLock lock(&mu_);
  return shut_down_;
}

absl::Status PlannerClient::Retry(absl::Duration total, const std::function<grpc::Status(grpc::ClientContext*)>& call,
                                  bool repeatable) {
  const absl::Time deadline = absl::Now() + total;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    grpc::ClientContext ctx;
    Authenticate(&ctx);
    ctx.set_deadline(absl::ToChronoTime(deadline));
    ctx.set_wait_for_ready(options_.wait_for_ready);
    if (!Track(&ctx)) return ShutDownError();
    const absl::Status s = FromGrpc(call(&ctx));
    Untrack(&ctx);
    const bool transient =
        s.code() == absl::StatusCode::kUnavailable || (repeatable && s.code() == absl::StatusCode::kCancelled);
    if (!transient || absl::Now() + backoff >= deadline) return shut_down() ? ShutDownError() : s;
    // The backoff ends early when the client shuts down.
    MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shut_down_; }, absl::Now() + backoff)) {
      return ShutDownError();
    }
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<std::string> PlannerClient::Submit(const proto::JobSpec& spec) {
  proto::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  proto::SubmitJobResponse resp;
  RETURN_IF_ERROR(Retry(
      options_.timeout, [&](grpc::ClientContext* c) { return jobs_->Submit(c, req, &resp); }, /*repeatable=*/false));
  return resp.job_id();
}

absl::StatusOr<proto::JobStatus> PlannerClient::Get(const std::string& job) {
  proto::GetJobRequest req;
  req.set_job_id(job);
  proto::JobStatus resp;
  RETURN_IF_ERROR(Retry(options_.timeout, [&](grpc::ClientContext* c) { return jobs_->Get(c, req, &resp); }));
  return resp;
}

absl::StatusOr<proto::GetIterationsResponse> PlannerClient::GetIterations(const std::string& job, int64_t from,
                                                                        int limit) {
  proto::GetIterationsRequest req;
  req.set_job_id(job);
  req.set_from_iteration(from);
  req.set_limit(limit);
  proto::GetIterationsResponse resp;
  RETURN_IF_ERROR(Retry(options_.timeout, [&](grpc::ClientContext* c) { return jobs_->GetIterations(c, req, &resp); }));
  return resp;
}

absl::StatusOr<proto::GetIterationResponse> PlannerClient::GetIteration(const std::string& job, int64_t iteration) {
  proto::GetIterationRequest req;
  req.set_job_id(job);
  req.set_iteration(iteration);
  proto::GetIterationResponse resp;
  RETURN_IF_ERROR(Retry(options_.timeout, [&](grpc::ClientContext* c) { return jobs_->GetIteration(c, req, &resp); }));
  return resp;
}

absl::StatusOr<proto::ListJobsResponse> PlannerClient::List() {
  proto::ListJobsResponse resp;
  RETURN_IF_ERROR(Retry(options_.timeout, [&](grpc::ClientContext* c) { return jobs_->List(c, {}, &resp); }));
  return resp;
}

absl::Status PlannerClient::Cancel(const std::string& job) {
  proto::CancelJobRequest req;
  req.set_job_id(job);
  proto::CancelJobResponse resp;
  return Retry(options_.timeout, [&](grpc::ClientContext* c) { return jobs_->Cancel(c, req, &resp); });
}

absl::Status PlannerClient::Watch(const std::string& job, const std::function<bool(const proto::JobEvent&)>& on_event,
                                 absl::Duration reconnect_grace) {
  proto::WatchJobRequest req;
  req.set_job_id(job);
  absl::Time unreachable_since = absl::InfiniteFuture();  // start of the outage being ridden through
  absl::Duration backoff = absl::Milliseconds(200);
  while (true) {
    grpc::ClientContext ctx;
    Authenticate(&ctx);
    if (!Track(&ctx)) return ShutDownError();
    auto reader = jobs_->Watch(&ctx, req);
    proto::JobEvent event;
    bool stopped = false;  // by on_event
    while (reader->Read(&event)) {
      unreachable_since = absl::InfiniteFuture();
      backoff = absl::Milliseconds(200);
      if (!on_event(event)) {
        stopped = true;
        ctx.TryCancel();
        break;
      }
    }
    const absl::Status s = FromGrpc(reader->Finish());
    Untrack(&ctx);
    if (shut_down()) return ShutDownError();
    if (stopped || s.ok()) return absl::OkStatus();
    const bool outage = s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled;
    if (!outage) return s;
    const absl::Time now = absl::Now();
    if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
    const absl::Time give_up = unreachable_since + reconnect_grace;
    if (now >= give_up) {
      if (reconnect_grace <= absl::ZeroDuration()) return s;
      return absl::UnavailableError(absl::StrCat("the planner at ", options_.address, " stayed unreachable for ",
                                                 absl::FormatDuration(absl::Trunc(now - unreachable_since,
                                                                                  absl::Seconds(1))),
                                                 " (", s.message(), ")"));
    }
    {
      // Backoff, cut short by Shutdown.
      MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shut_down_; },
                                std::min(give_up, absl::Now() + backoff))) {
        return ShutDownError();
      }
    }
    backoff = std::min(backoff * 2, absl::Seconds(2));
    // Until the channel connects again (a fail-fast stream would end at once),
    // in slices so Shutdown is noticed.
    while (!shut_down() && absl::Now() < give_up &&
           !channel_->WaitForConnected(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Milliseconds(200))))) {
    }
  }
}

absl::StatusOr<proto::ExecutionPlan> PlannerClient::FetchPlan(const std::string& job, int64_t iteration, int rank,
                                                              absl::Duration wait) {
  proto::FetchPlanRequest req;
  req.set_job_id(job);
  req.set_iteration(iteration);
  req.set_rank(rank);
  proto::FetchPlanResponse resp;
  RETURN_IF_ERROR(Retry(wait, [&](grpc::ClientContext* c) { return plans_->FetchPlan(c, req, &resp); }));
  return std::move(*resp.mutable_plan());
}

absl::Status PlannerClient::ReportIteration(const proto::IterationReport& report) {
  proto::ReportIterationResponse resp;
  return Retry(options_.timeout, [&](grpc::ClientContext* c) { return plans_->ReportIteration(c, report, &resp); });
}

absl::StatusOr<proto::RegisterExecutorResponse> PlannerClient::Register(const proto::RegisterExecutorRequest& req) {
  proto::RegisterExecutorResponse resp;
  RETURN_IF_ERROR(Retry(
      options_.timeout, [&](grpc::ClientContext* c) { return registry_->Register(c, req, &resp); }, /*repeatable=*/false));
  return resp;
}

void PlannerClient::SetExecutorCredential(ExecutorCredential credential) {
  MutexLock lock(&mu_);
  credential_ = std::move(credential);
}

void PlannerClient::Authenticate(grpc::ClientContext* context) {
  AttachToken(context, options_.token);
  MutexLock lock(&mu_);
  AttachExecutorCredential(context, credential_);
}

absl::StatusOr<proto::HeartbeatResponse> PlannerClient::Heartbeat(const proto::HeartbeatRequest& req) {
  proto::HeartbeatResponse resp;
  RETURN_IF_ERROR(Retry(options_.timeout, [&](grpc::ClientContext* c) { return registry_->Heartbeat(c, req, &resp); }));
  return resp;
}

absl::StatusOr<proto::ListExecutorsResponse> PlannerClient::Executors() {
  proto::ListExecutorsResponse resp;
  RETURN_IF_ERROR(Retry(options_.timeout, [&](grpc::ClientContext* c) { return registry_->List(c, {}, &resp); }));
  return resp;
}

absl::Status PlannerClient::BootstrapSet(const std::string& job, const std::string& key, const std::string& value) {
  proto::BootstrapSetRequest req;
  req.set_job_id(job);
  req.set_key(key);
  req.set_value(value);
  proto::BootstrapSetResponse resp;
  return Retry(options_.timeout, [&](grpc::ClientContext* c) { return bootstrap_->Set(c, req, &resp); });
}

absl::StatusOr<std::string> PlannerClient::BootstrapGet(const std::string& job, const std::string& key,
                                                        absl::Duration wait) {
  proto::BootstrapGetRequest req;
  req.set_job_id(job);
  req.set_key(key);
  proto::BootstrapGetResponse resp;
  RETURN_IF_ERROR(Retry(wait, [&](grpc::ClientContext* c) { return bootstrap_->Get(c, req, &resp); }));
  return resp.value();
}

}  // namespace dynapipe::rpc
