#pragma once

// The executor daemon's logic (one per device): registers with the planner,
// heartbeats, takes a rank of a job when assigned, connects to its peers,
// resumes from the job's checkpoint if it starts past iteration 0, fetches
// plans ahead of time, runs them through a Worker, reports every iteration
// (and failures, naming rank, iteration and instruction), writes checkpoint
// shards, and goes back to idle when the job ends. A heartbeat answer to
// stop (the job failed or was cancelled elsewhere) aborts the communicator,
// so nothing waits on a dead peer past its deadline.

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/services.pb.h"
#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "src/data/dataset.h"
#include "runtime/executor/worker.h"
#include "src/common/mutex.h"
#include "src/http/metrics.h"
#include "src/rpc/planner_client.h"
#include "src/spec/job_spec.h"
#include "src/rpc/defaults.h"

namespace dynapipe::runtime::executor {

struct ExecutorOptions {
  rpc::PlannerClient::Options planner;
  std::string node = "local";
  int device = 0;
  std::string data_root;        // relative dataset paths resolve here
  std::string listen_address{rpc::kLoopbackHost};  // for peers' connections
  absl::Duration comm_timeout = comm::kDefaultCommTimeout;
  absl::Duration connect_timeout = comm::kDefaultConnectTimeout;
  int prefetch = 2;             // plans fetched ahead of the running iteration
  // Tests only: runs on the job thread after a job ends (its communicator
  // already destroyed), before the executor forgets the job: where a
  // heartbeat's abort could once reach a freed communicator.
  std::function<void()> after_job_for_test;
};

class Executor {
 public:
  // `backend` is this process's device (runtime/backend/backend.h).
  Executor(ExecutorOptions options, std::unique_ptr<Backend> backend);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Connects to the planner and serves jobs until Shutdown(). Returns an
  // error only for what retrying cannot fix.
  absl::Status Run();
  // Thread-safe; aborts a running job's communication.
  void Shutdown();

  // Status endpoint.
  std::string HealthProblem() const;
  std::string StatusJson() const;
  std::string MetricsText() { return metrics_.Render() + http::ProcessMetricsText("dynapipe"); }

 private:
  absl::Status RegisterOnce();
  void HeartbeatLoop();
  // Runs the job (RunJobSteps); an allocation failure anywhere in it fails
  // the job, reported, instead of the process.
  absl::Status RunJob(const proto::Assignment& a);
  absl::Status RunJobSteps(const proto::Assignment& a);
  // RunJobSteps' phases. Each returns what fails the job; RunJobSteps
  // reports it.
  struct JobInputs {
    explicit JobInputs(spec::NormalizedJobSpec s) : spec(std::move(s)) {}
    spec::NormalizedJobSpec spec;
    std::string ckpt_dir;                    // under --data_root; empty: no checkpoints
    std::string init_from;                   // model.init_from under --data_root; empty: none
    std::string export_dir;                  // export_dir under --data_root; empty: none
    std::unique_ptr<data::Dataset> dataset;  // opened under --data_root
  };
  struct RunningJob;
  // Binds the backend to this thread and resolves the job's spec, dataset
  // and checkpoint directory.
  absl::StatusOr<JobInputs> LoadJob(const proto::Assignment& a);
  // Connects to the job's ranks and publishes the communicator to
  // AbortJob (aborted at once if the job was stopped meanwhile); the caller
  // unpublishes it before it is destroyed.
  absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectJob(const proto::Assignment& a,
                                                                 comm::KeyValueStore* store);
  // The rank's worker for the layers of its first plan.
  absl::StatusOr<std::unique_ptr<Worker>> CreateWorker(const proto::Assignment& a, const spec::NormalizedJobSpec& spec,
                                                       const proto::ExecutionPlan& first,
                                                       std::span<const int32_t> layers, comm::Communicator* comm,
                                                       const data::Dataset* dataset, const std::string& init_from);
  // After an iteration ran: its report to the planner and its checkpoint
  // when one is due (on disk before the report on the job's last iteration,
  // written behind it otherwise), then its metrics.
  absl::Status CompleteIteration(const RunningJob& job, int64_t iteration, const proto::ExecutionPlan& plan,
                                 IterationResult& result);
  // Reports `s` as this rank's failure of `iteration` (unless the job already
  // ended elsewhere), so the planner fails the job and the other ranks stop.
  void ReportFailure(const proto::Assignment& a, int64_t iteration, const absl::Status& s);
  void AbortJob(const std::string& why);
  // Metrics, the log line and the status of one finished iteration.
  void RecordIteration(const std::string& job, int64_t iteration, int64_t iterations, const proto::Assignment& a,
                       const IterationResult& result, double predicted_ms, bool checkpoint);

  ExecutorOptions options_;
  std::unique_ptr<Backend> backend_;  // used by the thread running jobs
  std::string backend_description_;   // Describe(), for /status (set once)
  // Set once by Run (under mu_, for Shutdown); the run and heartbeat threads
  // read it without the lock after that.
  std::unique_ptr<rpc::PlannerClient> client_;
  http::Metrics metrics_;
  std::string metrics_job_;  // the job whose series metrics_ holds (the run loop's thread only)
  std::atomic<bool> stopping_{false};
  // When Shutdown was first called (absl::ToUnixNanos), for the checkpoint
  // write's grace; 0 before.
  std::atomic<int64_t> stopping_since_ns_{0};
  // A shard being written at shutdown gets this long to finish (most take
  // milliseconds) before it is discarded, within the 2 s a daemon has to exit.
  static constexpr absl::Duration kCheckpointShutdownGrace = absl::Seconds(1);
  std::thread heartbeat_;

  mutable Mutex mu_;
  std::string executor_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = rpc::kDefaultHeartbeatInterval;
  proto::Assignment assignment_ ABSL_GUARDED_BY(mu_);  // latest from the planner
  std::string running_job_ ABSL_GUARDED_BY(mu_);
  comm::Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the running job
  bool stop_job_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_iteration_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t running_job_iterations_ ABSL_GUARDED_BY(mu_) = -1;  // the running job's length, once known
  double last_loss_ ABSL_GUARDED_BY(mu_) = 0;
  double last_iteration_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_heartbeat_ok_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::runtime::executor
