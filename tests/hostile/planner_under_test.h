#pragma once

// A real dynapipe-planner process under hostile input, and how its answers
// are classified: raw gRPC stubs (one attempt, no client-side checks or size
// limit, so what the planner itself answers is what is seen), the `dynapipe`
// CLI as a child process, and after every input a check that the process is
// alive and GET /healthz answers 200 (else the input counts as a crash and
// the planner is restarted, so the rest of the corpus still runs).

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/services.grpc.pb.h"
#include "tests/hostile/process_runner.h"
#include "tests/hostile/tally.h"
#include "tests/integration/control_plane_fixture.h"

namespace dynapipe::testing::hostile {

// No answer within this long is a hang.
inline constexpr absl::Duration kDeadline = absl::Seconds(15);

class PlannerUnderTest {
 public:
  // `flags`: dynapipe-planner flags beyond those PlannerProcess::Start sets.
  // `token`: what calls carry ("" = none).
  PlannerUnderTest(int redis_port, std::vector<std::string> flags, std::string token);

  absl::Status Start();
  const std::string& address() const { return address_; }
  int port() const { return planner_->port(); }
  int http_port() const { return planner_->http_port(); }
  const std::string& token() const { return token_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  proto::JobService::Stub& jobs() { return *jobs_; }
  proto::PlanService::Stub& plans() { return *plans_; }
  proto::ExecutorRegistry::Stub& registry() { return *registry_; }
  proto::Bootstrap::Stub& bootstrap() { return *bootstrap_; }

  // True when the process is alive and /healthz answers 200. Otherwise
  // restarts the planner (so later inputs still meet a planner) and returns
  // false: the input just fed crashed it.
  bool Healthy();
  int restarts() const { return restarts_; }

  // A context carrying the token and a deadline of `limit`.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration limit = kDeadline) const;

  // Submits `spec` (one attempt); an accepted job is cancelled at once so
  // that it does not keep the planning threads busy.
  Result Submit(const proto::JobSpec& spec);
  // Cancels `job` (best effort).
  void Cancel(const std::string& job);

  // A finished call: classified by its status, how long it took against
  // `limit` and the planner's health afterwards.
  Result Classify(const grpc::Status& status, absl::Duration took, absl::Duration limit = kDeadline);
  // A finished CLI run: exit 0 is acceptance, a signal a crash, a timeout a hang.
  Result Classify(const ProcessResult& run);

  // `dynapipe <command> --planner ADDRESS [--token-file FILE] --timeout-s 15 <args...>`.
  ProcessResult Cli(const std::string& command, const std::vector<std::string>& args) const;

 private:
  int redis_port_;
  std::vector<std::string> flags_;
  std::string token_, token_file_;
  std::unique_ptr<PlannerProcess> planner_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::JobService::Stub> jobs_;
  std::unique_ptr<proto::PlanService::Stub> plans_;
  std::unique_ptr<proto::ExecutorRegistry::Stub> registry_;
  std::unique_ptr<proto::Bootstrap::Stub> bootstrap_;
  int restarts_ = 0;
};

// The `dynapipe` CLI binary in the runfiles.
std::string CliPath();
// TEST_TMPDIR, else /tmp.
std::string TmpDir();
// Writes `text` to `path` with mode 0600 (token files must be private).
absl::Status WriteSecret(const std::string& path, const std::string& text);

}  // namespace dynapipe::testing::hostile
