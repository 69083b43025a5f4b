#include "planner/service/grpc_services.h"

#include <chrono>

#include "src/rpc/auth.h"
#include "src/rpc/status_conversion.h"

namespace dynapipe::planner::service {
namespace {

// Every call touching the store runs on the service's store workers, never
// on gRPC's callback threads: a stalled Redis holds up workers, and the
// server keeps answering. When too many calls already wait for a worker, a
// call is refused UNAVAILABLE (clients retry with backoff).
grpc::Status Overloaded() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the planner is overloaded: too many calls wait for the plan store (Redis); retry");
}

// The token is checked here, on gRPC's thread; then `fn` (its status, and
// for UnaryResult its value into `resp`) completes the call on a store
// worker, unless the call's deadline passed while it waited for one. `fn`
// may use the request and `ctx`: both live until the call is finished.
template <typename Fn>
grpc::ServerUnaryReactor* Unary(PlannerService* s, grpc::CallbackServerContext* ctx, const std::string& token, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (const grpc::Status auth = rpc::CheckToken(*ctx, token); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  const auto deadline = ctx->deadline();
  if (!s->Offload([reactor, deadline, fn = std::move(fn)] {
        if (std::chrono::system_clock::now() >= deadline) {
          reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call waited past its deadline"));
          return;
        }
        reactor->Finish(rpc::ToGrpc(fn()));
      })) {
    reactor->Finish(Overloaded());
  }
  return reactor;
}

template <typename Resp, typename Fn>
grpc::ServerUnaryReactor* UnaryResult(PlannerService* s, grpc::CallbackServerContext* ctx, const std::string& token,
                                      Resp* resp, Fn fn) {
  return Unary(s, ctx, token, [resp, fn = std::move(fn)]() -> absl::Status {
    auto r = fn();
    if (r.ok()) *resp = std::move(*r);
    return r.status();
  });
}

// Status reads: the service answers within its status budget (from the
// last known state when the store is slow); `done` fills `resp`.
template <typename Resp, typename Start>
grpc::ServerUnaryReactor* StatusRead(grpc::CallbackServerContext* ctx, const std::string& token, Resp* resp,
                                     Start start) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (const grpc::Status auth = rpc::CheckToken(*ctx, token); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  start([reactor, resp](absl::StatusOr<Resp> r) {
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(rpc::ToGrpc(r.status()));
  });
  return reactor;
}

// For executor-side calls: the caller's credential (x-dynapipe-executor),
// checked by `authorize` before `fn` runs. Returns what `fn` returns, or the
// refusal.
template <typename Authorize, typename Fn>
auto AsExecutor(grpc::CallbackServerContext* ctx, Authorize authorize, Fn fn) -> decltype(fn()) {
  absl::StatusOr<rpc::ExecutorCredential> caller = rpc::CallerCredential(*ctx);
  if (!caller.ok()) return caller.status();
  if (absl::Status s = authorize(*caller); !s.ok()) return s;
  return fn();
}

// The call's deadline, capped so that a client without one cannot park a
// request forever.
absl::Time Deadline(const grpc::CallbackServerContext& ctx) {
  const absl::Time cap = absl::Now() + absl::Minutes(5);
  const auto d = ctx.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return cap;
  return std::min(cap, absl::FromChrono(d));
}

// Server-streaming Watch: events are written one at a time; while a write is
// in flight only the newest pending event is kept.
class WatchReactor : public grpc::ServerWriteReactor<proto::JobEvent> {
 public:
  struct Shared {
    Mutex mu;
    WatchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // null once done
  };

  WatchReactor() : shared_(std::make_shared<Shared>()) {
    MutexLock lock(&shared_->mu);
    shared_->reactor = this;
  }
  std::shared_ptr<Shared> shared() { return shared_; }

  // False once the client went away.
  static bool Push(const std::shared_ptr<Shared>& s, const proto::JobEvent& e) {
    MutexLock lock(&s->mu);
    WatchReactor* r = s->reactor;
    if (r == nullptr || r->cancelled_) return false;
    if (r->writing_) {
      r->pending_ = e;
      r->has_pending_ = true;
    } else {
      r->current_ = e;
      r->writing_ = true;
      r->StartWrite(&r->current_);
    }
    return true;
  }

  static void End(const std::shared_ptr<Shared>& s, const grpc::Status& status) {
    MutexLock lock(&s->mu);
    WatchReactor* r = s->reactor;
    if (r == nullptr || r->finishing_) return;
    if (r->writing_) {
      r->end_ = status;
      r->end_requested_ = true;
    } else {
      r->finishing_ = true;
      r->Finish(status);
    }
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&shared_->mu);
    writing_ = false;
    if (!ok) {
      cancelled_ = true;
      if (!finishing_) {
        finishing_ = true;
        Finish(grpc::Status::CANCELLED);
      }
      return;
    }
    if (has_pending_) {
      current_ = pending_;
      has_pending_ = false;
      writing_ = true;
      StartWrite(&current_);
    } else if (end_requested_ && !finishing_) {
      finishing_ = true;
      Finish(end_);
    }
  }
  void OnCancel() override {
    MutexLock lock(&shared_->mu);
    cancelled_ = true;
  }
  void OnDone() override {
    {
      MutexLock lock(&shared_->mu);
      shared_->reactor = nullptr;
    }
    delete this;
  }

 private:
  std::shared_ptr<Shared> shared_;
  proto::JobEvent current_, pending_;
  bool writing_ = false, has_pending_ = false, cancelled_ = false, finishing_ = false, end_requested_ = false;
  grpc::Status end_;
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::Submit(grpc::CallbackServerContext* ctx, const proto::SubmitJobRequest* req,
                                                 proto::SubmitJobResponse* resp) {
  return UnaryResult(s_, ctx, token_, resp, [this, req] { return s_->Submit(*req); });
}

grpc::ServerUnaryReactor* JobServiceImpl::Get(grpc::CallbackServerContext* ctx, const proto::GetJobRequest* req,
                                              proto::JobStatus* resp) {
  return StatusRead(ctx, token_, resp, [this, req](auto done) { s_->GetWithin(*req, std::move(done)); });
}

grpc::ServerUnaryReactor* JobServiceImpl::List(grpc::CallbackServerContext* ctx, const proto::ListJobsRequest*,
                                               proto::ListJobsResponse* resp) {
  return StatusRead(ctx, token_, resp, [this](auto done) { s_->ListWithin(std::move(done)); });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetIterations(grpc::CallbackServerContext* ctx,
                                                        const proto::GetIterationsRequest* req,
                                                        proto::GetIterationsResponse* resp) {
  return UnaryResult(s_, ctx, token_, resp, [this, req] { return s_->GetIterations(*req); });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetIteration(grpc::CallbackServerContext* ctx,
                                                       const proto::GetIterationRequest* req,
                                                       proto::GetIterationResponse* resp) {
  return UnaryResult(s_, ctx, token_, resp, [this, req] { return s_->GetIteration(*req); });
}

grpc::ServerUnaryReactor* JobServiceImpl::Cancel(grpc::CallbackServerContext* ctx, const proto::CancelJobRequest* req,
                                                 proto::CancelJobResponse* resp) {
  return UnaryResult(s_, ctx, token_, resp, [this, req] { return s_->Cancel(*req); });
}

grpc::ServerWriteReactor<proto::JobEvent>* JobServiceImpl::Watch(grpc::CallbackServerContext* ctx,
                                                                 const proto::WatchJobRequest* req) {
  auto* reactor = new WatchReactor();
  const grpc::Status auth = rpc::CheckToken(*ctx, token_);
  auto shared = reactor->shared();
  if (!auth.ok()) {
    WatchReactor::End(shared, auth);
    return reactor;
  }
  if (!s_->Offload([this, job = req->job_id(), shared] {
        s_->Watch(
            job, [shared](const proto::JobEvent& e) { return WatchReactor::Push(shared, e); },
            [shared](absl::Status s) { WatchReactor::End(shared, rpc::ToGrpc(s)); });
      })) {
    WatchReactor::End(shared, Overloaded());
  }
  return reactor;
}

grpc::ServerUnaryReactor* PlanServiceImpl::FetchPlan(grpc::CallbackServerContext* ctx,
                                                     const proto::FetchPlanRequest* req,
                                                     proto::FetchPlanResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (const grpc::Status auth = rpc::CheckToken(*ctx, token_); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  const absl::Time deadline = Deadline(*ctx);
  if (!s_->Offload([this, req, resp, reactor, deadline] {
        s_->FetchPlan(*req, deadline, [reactor, resp](absl::StatusOr<proto::ExecutionPlan> plan) {
          if (plan.ok()) *resp->mutable_plan() = std::move(*plan);
          reactor->Finish(rpc::ToGrpc(plan.status()));
        });
      })) {
    reactor->Finish(Overloaded());
  }
  return reactor;
}

grpc::ServerUnaryReactor* PlanServiceImpl::ReportIteration(grpc::CallbackServerContext* ctx,
                                                           const proto::IterationReport* req,
                                                           proto::ReportIterationResponse*) {
  return Unary(s_, ctx, token_, [this, ctx, req]() {
    return AsExecutor(
        ctx, [&](const rpc::ExecutorCredential& c) { return s_->executors().AuthorizeReport(c, *req); },
        [&] { return s_->ReportIteration(*req); });
  });
}

grpc::ServerUnaryReactor* ExecutorRegistryImpl::Register(grpc::CallbackServerContext* ctx,
                                                         const proto::RegisterExecutorRequest* req,
                                                         proto::RegisterExecutorResponse* resp) {
  return UnaryResult(s_, ctx, token_, resp, [this, req] { return s_->executors().Register(*req); });
}

grpc::ServerUnaryReactor* ExecutorRegistryImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                          const proto::HeartbeatRequest* req,
                                                          proto::HeartbeatResponse* resp) {
  return UnaryResult(s_, ctx, token_, resp, [this, ctx, req] {
    return AsExecutor(
        ctx, [&](const rpc::ExecutorCredential& c) { return s_->executors().AuthorizeHeartbeat(c, *req); },
        [&] { return s_->executors().Heartbeat(*req); });
  });
}

grpc::ServerUnaryReactor* ExecutorRegistryImpl::List(grpc::CallbackServerContext* ctx,
                                                     const proto::ListExecutorsRequest*,
                                                     proto::ListExecutorsResponse* resp) {
  return StatusRead(ctx, token_, resp, [this](auto done) { s_->ExecutorsWithin(std::move(done)); });
}

grpc::ServerUnaryReactor* BootstrapImpl::Set(grpc::CallbackServerContext* ctx, const proto::BootstrapSetRequest* req,
                                             proto::BootstrapSetResponse*) {
  return Unary(s_, ctx, token_, [this, ctx, req]() {
    return AsExecutor(
        ctx, [&](const rpc::ExecutorCredential& c) { return s_->executors().AuthorizeJobMember(c, req->job_id()); },
        [&] { return s_->BootstrapSet(*req); });
  });
}

grpc::ServerUnaryReactor* BootstrapImpl::Get(grpc::CallbackServerContext* ctx, const proto::BootstrapGetRequest* req,
                                             proto::BootstrapGetResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (const grpc::Status auth = rpc::CheckToken(*ctx, token_); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  const absl::Time deadline = Deadline(*ctx);
  if (!s_->Offload([this, ctx, req, resp, reactor, deadline] {
        if (const absl::Status allowed = AsExecutor(
                ctx, [&](const rpc::ExecutorCredential& c) { return s_->executors().AuthorizeJobMember(c, req->job_id()); },
                [] { return absl::OkStatus(); });
            !allowed.ok()) {
          reactor->Finish(rpc::ToGrpc(allowed));
          return;
        }
        s_->BootstrapGet(*req, deadline, [reactor, resp](absl::StatusOr<std::string> v) {
          if (v.ok()) resp->set_value(std::move(*v));
          reactor->Finish(rpc::ToGrpc(v.status()));
        });
      })) {
    reactor->Finish(Overloaded());
  }
  return reactor;
}

}  // namespace dynapipe::planner::service
