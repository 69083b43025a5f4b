#include "tests/hostile/planner_under_test.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/file_util.h"
#include "src/rpc/auth.h"
#include "src/testing/raw_socket.h"

namespace dynapipe::testing::hostile {

std::string CliPath() { return RunfilesRoot() + "/cli/dynapipe"; }

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

absl::Status WriteSecret(const std::string& path, const std::string& text) {
  if (absl::Status s = WriteFileAtomic(path, text); !s.ok()) return s;
  if (::chmod(path.c_str(), 0600) != 0) return absl::InternalError(absl::StrCat("chmod ", path));
  return absl::OkStatus();
}

PlannerUnderTest::PlannerUnderTest(int redis_port, std::vector<std::string> flags, std::string token)
    : redis_port_(redis_port), flags_(std::move(flags)), token_(std::move(token)) {}

absl::Status PlannerUnderTest::Start() {
  std::vector<std::string> flags = flags_;
  if (!token_.empty() && token_file_.empty()) {
    static std::atomic<int> n{0};
    token_file_ = absl::StrCat(TmpDir(), "/hostile-token-", ::getpid(), "-", n++);
    if (absl::Status s = WriteSecret(token_file_, token_ + "\n"); !s.ok()) return s;
  }
  if (!token_file_.empty()) flags.push_back("--token_file=" + token_file_);
  planner_.reset();  // a crashed one is reaped; its ports are free again
  auto p = PlannerProcess::Start(redis_port_, flags);
  if (!p.ok()) return p.status();
  planner_ = std::move(*p);
  address_ = planner_->address();
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);  // the planner, not this client, must refuse what is too large
  args.SetMaxReceiveMessageSize(rpc::kMaxPlannerResponseBytes);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  jobs_ = proto::JobService::NewStub(channel_);
  plans_ = proto::PlanService::NewStub(channel_);
  registry_ = proto::ExecutorRegistry::NewStub(channel_);
  bootstrap_ = proto::Bootstrap::NewStub(channel_);
  return absl::OkStatus();
}

bool PlannerUnderTest::Healthy() {
  if (!planner_->Exited(absl::ZeroDuration()) && HealthzOk(planner_->http_port())) return true;
  ++restarts_;
  if (absl::Status s = Start(); !s.ok()) std::fprintf(stderr, "hostile: restarting the planner: %s\n", s.ToString().c_str());
  return false;
}

std::unique_ptr<grpc::ClientContext> PlannerUnderTest::Context(absl::Duration limit) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  rpc::AttachToken(ctx.get(), token_);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + limit));
  return ctx;
}

Result PlannerUnderTest::Submit(const proto::JobSpec& spec) {
  proto::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  proto::SubmitJobResponse resp;
  auto ctx = Context();
  const absl::Time t0 = absl::Now();
  const grpc::Status s = jobs_->Submit(ctx.get(), req, &resp);
  const absl::Duration took = absl::Now() - t0;
  if (s.ok()) Cancel(resp.job_id());
  Result r = Classify(s, took);
  if (s.ok()) r.message = "job " + resp.job_id();
  return r;
}

void PlannerUnderTest::Cancel(const std::string& job) {
  proto::CancelJobRequest req;
  req.set_job_id(job);
  proto::CancelJobResponse resp;
  (void)jobs_->Cancel(Context().get(), req, &resp);
}

Result PlannerUnderTest::Classify(const grpc::Status& status, absl::Duration took, absl::Duration limit) {
  const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  if (!Healthy()) {
    return {Outcome::kCrash, "planner down",
            absl::StrCat("the planner died or stopped answering /healthz; the call got ", code, ": ",
                         status.error_message())};
  }
  if (status.ok()) return {Outcome::kAccepted, "OK", ""};
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && took >= limit - absl::Milliseconds(200)) {
    return {Outcome::kHang, "no answer", absl::StrCat("no answer within ", absl::FormatDuration(limit))};
  }
  return {Outcome::kRefused, code, status.error_message()};
}

Result PlannerUnderTest::Classify(const ProcessResult& run) {
  const bool healthy = Healthy();
  if (run.timed_out) {
    return {Outcome::kHang, "no exit", absl::StrCat("still running after ", absl::FormatDuration(run.took), ": ", run.err)};
  }
  if (run.signaled) {
    return {Outcome::kCrash, absl::StrCat("signal ", run.signal),
            absl::StrCat("killed by signal ", run.signal, " (", strsignal(run.signal), "): ", run.err)};
  }
  if (!healthy) return {Outcome::kCrash, "planner down", "the planner died or stopped answering /healthz"};
  if (run.exit_code == 0) return {Outcome::kAccepted, "exit 0", run.out};
  return {Outcome::kRefused, absl::StrCat("exit ", run.exit_code), run.err};
}

ProcessResult PlannerUnderTest::Cli(const std::string& command, const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {CliPath(), command, "--planner", address_, "--timeout-s",
                                   absl::StrCat(absl::ToInt64Seconds(kDeadline))};
  if (!token_file_.empty()) argv.insert(argv.end(), {"--token-file", token_file_});
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, kDeadline + absl::Seconds(10));
}

}  // namespace dynapipe::testing::hostile
