#pragma once

// Client wrapper for the planner daemon's services: every call carries the
// token and a deadline; only UNAVAILABLE is retried (with backoff, within the
// deadline). Used by the `dynapipe` CLI, executors and tests. An executor
// sets the credential Register returned: from then on every call carries it
// too (executor_credential.h).

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/services.grpc.pb.h"
#include "src/common/mutex.h"
#include "src/rpc/auth.h"
#include "src/rpc/defaults.h"

namespace dynapipe::rpc {

class PlannerClient {
 public:
  struct Options {
    std::string address = std::string(kDefaultPlannerAddress);
    std::string token;
    TlsFiles tls;
    // Per call, retries included: how long a planner outage (a restart, a
    // network blip) may last before a call gives up. Calls are retried while
    // the planner is UNAVAILABLE, and calls that may be repeated also when it
    // CANCELLED them (a planner shutting down cancels the calls in flight).
    absl::Duration timeout = kDefaultCallTimeout;
    // Calls wait (within `timeout`) for the channel to connect instead of
    // failing at once while it is down. For daemons riding through planner
    // restarts: with fail-fast calls, gRPC 1.51 cancels its own reconnection
    // attempts and kept executors away from a restarted planner for seconds.
    bool wait_for_ready = false;
    // When positive, Connect waits this long for the channel to connect and
    // fails with UNAVAILABLE naming the address if it does not (a command-line
    // client reports a planner that is down at once instead of at `timeout`).
    absl::Duration connect_timeout = absl::ZeroDuration();
  };
  static absl::StatusOr<std::unique_ptr<PlannerClient>> Connect(Options options);

  absl::StatusOr<std::string> Submit(const proto::JobSpec& spec);
  absl::StatusOr<proto::JobStatus> Get(const std::string& job);
  absl::StatusOr<proto::ListJobsResponse> List();
  absl::Status Cancel(const std::string& job);
  // Streams events to `on_event` until the job ends (OK) or `on_event`
  // returns false (OK). A stream broken by a planner outage (UNAVAILABLE, or
  // CANCELLED by a planner shutting down) is opened again, with backoff, as
  // long as the planner has been unreachable for less than `reconnect_grace`;
  // the new stream starts with the job's current status, which `on_event`
  // may have seen already. Then, or for any other error, that error.
  absl::Status Watch(const std::string& job, const std::function<bool(const proto::JobEvent&)>& on_event,
                     absl::Duration reconnect_grace = absl::ZeroDuration());
  // The job's history from `from` (at most `limit`; 0: the server's default).
  absl::StatusOr<proto::GetIterationsResponse> GetIterations(const std::string& job, int64_t from, int limit);
  // One iteration's plans and reports.
  absl::StatusOr<proto::GetIterationResponse> GetIteration(const std::string& job, int64_t iteration);

  // Waits up to `wait` for the plan on the server side.
  absl::StatusOr<proto::ExecutionPlan> FetchPlan(const std::string& job, int64_t iteration, int rank, absl::Duration wait);
  absl::Status ReportIteration(const proto::IterationReport& report);
  // The response holds this executor's id and secret; pass them to
  // SetExecutorCredential.
  absl::StatusOr<proto::RegisterExecutorResponse> Register(const proto::RegisterExecutorRequest& req);
  // Thread-safe; calls started afterwards carry `credential` (empty: none).
  void SetExecutorCredential(ExecutorCredential credential);
  // Thread-safe and final: cancels the calls in flight (a retry's backoff
  // included) and makes every later call fail at once with CANCELLED. A daemon
  // shutting down calls it so no thread stays in a call waiting for a planner
  // that is down (`timeout` can be a minute).
  void Shutdown();
  bool shut_down() const;
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(const proto::HeartbeatRequest& req);
  absl::StatusOr<proto::ListExecutorsResponse> Executors();
  absl::Status BootstrapSet(const std::string& job, const std::string& key, const std::string& value);
  absl::StatusOr<std::string> BootstrapGet(const std::string& job, const std::string& key, absl::Duration wait);

 private:
  explicit PlannerClient(Options o) : options_(std::move(o)) {}
  // Runs `call` (one attempt with the given context) until it is not
  // UNAVAILABLE or `total` has passed.
  // Calls until OK, a lasting error or `total` passes. UNAVAILABLE is retried;
  // CANCELLED (the planner shut down mid-call, perhaps after acting on it)
  // only when `repeatable`: a Submit or Register repeated would act twice.
  absl::Status Retry(absl::Duration total, const std::function<grpc::Status(grpc::ClientContext*)>& call,
                     bool repeatable = true);
  // Adds the token and the executor credential to a call.
  void Authenticate(grpc::ClientContext* context);

  // Registers a call's context so Shutdown can cancel it; false once shut down.
  bool Track(grpc::ClientContext* context);
  void Untrack(grpc::ClientContext* context);

  Options options_;
  mutable Mutex mu_;
  ExecutorCredential credential_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::JobService::Stub> jobs_;
  std::unique_ptr<proto::PlanService::Stub> plans_;
  std::unique_ptr<proto::ExecutorRegistry::Stub> registry_;
  std::unique_ptr<proto::Bootstrap::Stub> bootstrap_;
};

}  // namespace dynapipe::rpc
