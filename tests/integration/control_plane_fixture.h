#pragma once

// Shared pieces of the control-plane integration tests: a small job on the
// FLAN-like lengths, planner processes, and simulated executors that fetch
// plans and report iterations through the real gRPC services.

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "planner/service/planner_server.h"
#include "proto/job.pb.h"
#include "src/rpc/planner_client.h"
#include "src/testing/redis_server.h"
#include "src/testing/eventually.h"

namespace dynapipe::testing {

// A GPT job on tests/data/flan-like-lengths.txt with `pp` x `dp` ranks.
proto::JobSpec SmallJob(int pp, int dp, int iterations, int lookahead, int layers = 8);

// The repository root inside the test's runfiles.
std::string RunfilesRoot();

// A child process of the test (execv of argv[0]); SIGKILLed and reaped when
// destroyed.
class ChildProcess {
 public:
  // `env`: variables set in the child only.
  explicit ChildProcess(std::vector<std::string> argv,
                        const std::vector<std::pair<std::string, std::string>>& env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  pid_t pid() const { return pid_; }
  void Signal(int sig);  // SIGKILL / SIGTERM
  // True once the process has exited (and is reaped), polling up to `wait`.
  bool Exited(absl::Duration wait);
  // waitpid's status once Exited() returned true; -1 before.
  int wait_status() const { return wait_status_; }

 private:
  pid_t pid_ = -1;
  int wait_status_ = -1;
};

// A dynapipe-planner child process.
class PlannerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PlannerProcess>> Start(int redis_port, const std::vector<std::string>& extra);
  int port() const { return port_; }
  int http_port() const { return http_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return process_->pid(); }
  void Signal(int sig) { process_->Signal(sig); }
  bool Exited(absl::Duration wait) { return process_->Exited(wait); }
  int wait_status() const { return process_->wait_status(); }

 private:
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0, http_port_ = 0;
};

// Simulated executor ranks: each fetches its plan for every iteration, sleeps
// `work` (+-20%, starts staggered by 3 ms per rank), reports as the executor
// `credential` (the holder of `rank`, see JoinJob) and heartbeats every
// second meanwhile. Runs on its own thread until all iterations are done,
// `stop` is set, or a call fails.
struct SimulatedRank {
  std::thread thread;
  std::atomic<int64_t> done{-1};
  absl::Status status;
  std::vector<double> fetch_ms;  // latency of FetchPlan calls
};

// `heartbeats`: whether the rank's executor heartbeats every second meanwhile
// (needed once a run can outlast the heartbeat timeout, or a planner restarts).
std::unique_ptr<SimulatedRank> RunRank(std::function<std::string()> address, const std::string& job, int rank,
                                       const rpc::ExecutorCredential& credential, int64_t iterations,
                                       absl::Duration work, std::atomic<bool>* stop, bool heartbeats = true);

// A job trained by simulated ranks: `world` executors registered at
// `address` hold its ranks and run RunRank (`work` per iteration) until the
// job's iterations are done or the SimulatedJob is destroyed (then they stop
// and are joined).
struct SimulatedJob {
  std::string id;
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<SimulatedRank>> ranks;
  ~SimulatedJob();
};
// Submits `spec` (pp x dp ranks); REQUIREs that it is accepted and placed.
std::unique_ptr<SimulatedJob> RunSimulatedJob(const std::string& address, const proto::JobSpec& spec,
                                              absl::Duration work);

std::unique_ptr<rpc::PlannerClient> Client(const std::string& address, const std::string& token = "");

// A registered executor: its identity and a client that calls as it.
struct JoinedExecutor {
  rpc::ExecutorCredential credential;
  proto::Assignment assignment;
  std::unique_ptr<rpc::PlannerClient> client;
};

// Registers an executor (credential attached to its client) and sends its
// first heartbeat; `assignment` is what that heartbeat returned.
JoinedExecutor RegisterExecutor(const std::string& address, const std::string& node, int device,
                                const std::string& token = "");

// Registers `world` executors and heartbeats them until they hold the ranks of `job`
// (which must be the only pending job); index = rank. Aborts the test
// (REQUIRE) unless every rank of `job` is taken.
std::vector<JoinedExecutor> JoinJob(const std::string& address, const std::string& job, int world,
                                    const std::string& token = "");

// A real Redis and an in-process planner server on loopback ports.
struct Stack {
  std::unique_ptr<RedisServer> redis;
  std::unique_ptr<planner::service::PlannerServer> planner;
  std::string address() const { return "127.0.0.1:" + std::to_string(planner->port()); }
};
// Aborts the test (REQUIRE) if anything fails to start.
Stack StartStack(const std::string& token = "", absl::Duration heartbeat_timeout = absl::Seconds(10),
                 bool persistent = false, int planning_threads = 2);

}  // namespace dynapipe::testing
