#include "tests/integration/control_plane_fixture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/mutex.h"
#include "src/testing/redis_server.h"
#include "planner/testing/test_specs.h"

namespace dynapipe::testing {

std::string RunfilesRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? std::string(srcdir) + "/dynapipe" : ".";
}

proto::JobSpec SmallJob(int pp, int dp, int iterations, int lookahead, int layers) {
  proto::JobSpec s;
  s.set_name("itest");
  auto* m = s.mutable_model();
  m->set_kind(proto::ModelKind::gpt);
  m->set_num_layers(layers);
  m->set_hidden(1024);
  m->set_heads(16);
  m->set_ffn(4096);
  m->set_vocab(32000);
  m->set_max_positions(4096);
  m->set_dtype(proto::DType::bf16);
  s.mutable_parallelism()->set_pp(pp);
  s.mutable_parallelism()->set_dp(dp);
  s.mutable_dataset()->set_path(RunfilesRoot() + "/tests/data/flan-like-lengths.txt");
  s.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
  s.mutable_batching()->set_global_batch_tokens(16384);
  s.mutable_batching()->set_max_seq_len(2048);
  s.set_memory_limit_mb(40000);
  s.set_iterations(iterations);
  s.set_planner_lookahead(lookahead);
  *s.mutable_cluster() = planner::testing::H100Cluster();
  // As many 8-GPU nodes as the job's ranks need.
  s.mutable_cluster()->set_num_nodes((pp * dp + 7) / 8);
  return s;
}

ChildProcess::ChildProcess(std::vector<std::string> args,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

bool ChildProcess::Exited(absl::Duration wait) {
  if (pid_ <= 0) return true;
  const absl::Time deadline = absl::Now() + wait;
  do {
    if (::waitpid(pid_, &wait_status_, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  } while (absl::Now() < deadline);
  return false;
}

absl::StatusOr<std::unique_ptr<PlannerProcess>> PlannerProcess::Start(int redis_port,
                                                                      const std::vector<std::string>& extra) {
  auto p = std::unique_ptr<PlannerProcess>(new PlannerProcess());
  const char* tmp = std::getenv("TEST_TMPDIR");
  static std::atomic<int> counter{0};
  const std::string port_file = absl::StrCat(tmp ? tmp : "/tmp", "/planner-", ::getpid(), "-", counter++, ".port");
  std::vector<std::string> args = {RunfilesRoot() + "/planner/service/dynapipe-planner",
                                   "--listen=127.0.0.1:0",
                                   "--http_port=0",
                                   absl::StrCat("--redis=127.0.0.1:", redis_port),
                                   "--port_file=" + port_file,
                                   // Tests name files in TEST_TMPDIR and the runfiles tree;
                                   // confinement itself is tested in planner_service_test.
                                   "--data_root=/",
                                   "--log_level=warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  p->process_ = std::make_unique<ChildProcess>(std::move(args));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    if (in >> p->port_ >> p->http_port_) return p;
    if (p->Exited(absl::ZeroDuration())) return absl::UnavailableError("dynapipe-planner exited at start");
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("dynapipe-planner did not report its port");
}

std::unique_ptr<rpc::PlannerClient> Client(const std::string& address, const std::string& token) {
  rpc::PlannerClient::Options o;
  o.address = address;
  o.token = token;
  o.timeout = absl::Seconds(10);
  return std::move(*rpc::PlannerClient::Connect(o));
}

JoinedExecutor RegisterExecutor(const std::string& address, const std::string& node, int device,
                                const std::string& token) {
  JoinedExecutor e;
  e.client = Client(address, token);
  proto::RegisterExecutorRequest req;
  req.set_node(node);
  req.set_device_index(device);
  auto reg = e.client->Register(req);
  REQUIRE(reg.ok());
  e.credential = {reg->executor_id(), reg->executor_secret()};
  e.client->SetExecutorCredential(e.credential);
  proto::HeartbeatRequest hb;
  hb.set_executor_id(e.credential.executor_id);
  auto beat = e.client->Heartbeat(hb);
  REQUIRE(beat.ok());
  e.assignment = beat->assignment();
  return e;
}

std::vector<JoinedExecutor> JoinJob(const std::string& address, const std::string& job, int world,
                                    const std::string& token) {
  std::vector<JoinedExecutor> joined;
  for (int d = 0; d < world; ++d) joined.push_back(RegisterExecutor(address, "sim", d, token));
  // The job is placed as a gang once all are idle; each takes its seat at a
  // heartbeat after that.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (JoinedExecutor& e : joined) {
    while (e.assignment.job_id().empty() && absl::Now() < deadline) {
      proto::HeartbeatRequest hb;
      hb.set_executor_id(e.credential.executor_id);
      auto beat = e.client->Heartbeat(hb);
      REQUIRE(beat.ok());
      e.assignment = beat->assignment();
      if (e.assignment.job_id().empty()) absl::SleepFor(absl::Milliseconds(50));
    }
  }
  std::vector<JoinedExecutor> out(world);
  for (JoinedExecutor& e : joined) {
    REQUIRE(e.assignment.job_id() == job);
    REQUIRE((e.assignment.rank() >= 0 && e.assignment.rank() < world));
    REQUIRE(out[e.assignment.rank()].client == nullptr);
    out[e.assignment.rank()] = std::move(e);
  }
  return out;
}

SimulatedJob::~SimulatedJob() {
  stop = true;
  for (auto& r : ranks) r->thread.join();
}

std::unique_ptr<SimulatedJob> RunSimulatedJob(const std::string& address, const proto::JobSpec& spec,
                                              absl::Duration work) {
  auto job = std::make_unique<SimulatedJob>();
  auto id = Client(address)->Submit(spec);
  REQUIRE(id.ok());
  job->id = *id;
  const int world = spec.parallelism().pp() * std::max(1, spec.parallelism().dp());
  const std::vector<JoinedExecutor> joined = JoinJob(address, job->id, world);
  for (int r = 0; r < world; ++r) {
    job->ranks.push_back(RunRank([address] { return address; }, job->id, r, joined[r].credential,
                                 spec.iterations(), work, &job->stop));
  }
  return job;
}

std::unique_ptr<SimulatedRank> RunRank(std::function<std::string()> address, const std::string& job, int rank,
                                       const rpc::ExecutorCredential& credential, int64_t iterations,
                                       absl::Duration work, std::atomic<bool>* stop, bool heartbeats) {
  auto r = std::make_unique<SimulatedRank>();
  SimulatedRank* self = r.get();
  r->thread = std::thread([=] {
    // Like an executor: transient failures (planner restarting, shutting
    // down, unreachable) are retried against the current address for 30 s.
    auto transient = [](const absl::Status& s) {
      return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled ||
             s.code() == absl::StatusCode::kDeadlineExceeded;
    };
    // Heartbeats keep the executor alive (planners fail jobs whose executors
    // go silent), also while a call below waits out a planner restart. They
    // end before the last report: one after the job's end would take the
    // executor off the job (as a real executor's does once it has stopped).
    Mutex beat_mu;
    std::atomic<bool> finished{false};  // set under beat_mu: no heartbeat is in flight then, none follows
    auto finish_beats = [&] {
      MutexLock lock(&beat_mu);
      finished = true;
    };
    std::thread beat([&] {
      std::string at;
      std::unique_ptr<rpc::PlannerClient> c;
      proto::HeartbeatRequest hb;
      hb.set_executor_id(credential.executor_id);
      // Every second, each rank at its own phase (as independent executors
      // are), so that many ranks do not beat in one burst.
      int ticks = 1 + (rank * 7) % 50;
      while (true) {
        for (; ticks > 0 && !finished && !stop->load(); --ticks) absl::SleepFor(absl::Milliseconds(20));
        ticks = 50;
        MutexLock lock(&beat_mu);
        if (!heartbeats || finished || stop->load()) break;
        if (c == nullptr || address() != at) {
          at = address();
          c = Client(at);
          c->SetExecutorCredential(credential);
        }
        hb.set_iteration(self->done);
        (void)c->Heartbeat(hb);
      }
    });
    struct Join {
      std::function<void()> finish;
      std::thread* beat;
      ~Join() {
        finish();
        beat->join();
      }
    } join{finish_beats, &beat};
    std::string current;
    std::unique_ptr<rpc::PlannerClient> client;
    auto refresh = [&] {
      if (client == nullptr || address() != current) {
        current = address();
        client = Client(current);
        client->SetExecutorCredential(credential);
        (void)client->Get(job);  // connect now, so FetchPlan timings exclude connection set-up
      }
    };
    // Ranks of a real job do not run in lock-step: stagger the start and vary
    // each iteration's work by +-20%.
    std::mt19937 rng(static_cast<uint32_t>(rank) * 7919u + 1);
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    refresh();
    absl::SleepFor(absl::Milliseconds(3 * rank));
    for (int64_t i = 0; i < iterations && !stop->load(); ++i) {
      const absl::Time give_up = absl::Now() + absl::Seconds(30);
      absl::StatusOr<proto::ExecutionPlan> plan;
      double ms = 0;
      while (true) {
        refresh();
        const auto t0 = std::chrono::steady_clock::now();
        plan = client->FetchPlan(job, i, rank, absl::Seconds(10));
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (plan.ok() || !transient(plan.status()) || absl::Now() > give_up || stop->load()) break;
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (!plan.ok()) {
        self->status = plan.status();
        return;
      }
      self->fetch_ms.push_back(ms);
      absl::SleepFor(work * jitter(rng));
      proto::IterationReport report;
      report.set_job_id(job);
      report.set_iteration(i);
      report.set_rank(rank);
      report.set_iteration_ms(absl::ToDoubleMilliseconds(work));
      report.set_predicted_iteration_ms(plan->predicted_iteration_ms());
      report.set_tokens(1000);
      report.set_loss(5.0 / (1 + i));
      if (i + 1 == iterations) finish_beats();
      absl::Status s;
      while (true) {
        refresh();
        s = client->ReportIteration(report);
        if (s.ok() || !transient(s) || absl::Now() > give_up) break;
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (!s.ok()) {
        self->status = s;
        return;
      }
      self->done = i;
    }
  });
  return r;
}

Stack StartStack(const std::string& token, absl::Duration heartbeat_timeout, bool persistent, int planning_threads) {
  Stack s;
  auto redis = RedisServer::Start(absl::Seconds(10), persistent);
  REQUIRE(redis.ok());
  s.redis = std::move(*redis);
  planner::service::PlannerServer::Options o;
  o.redis.port = s.redis->port();
  o.redis.command_timeout = absl::Milliseconds(500);
  o.token = token;
  o.service.heartbeat_timeout = heartbeat_timeout;
  o.service.heartbeat_interval = absl::Milliseconds(100);
  o.service.recheck = absl::Milliseconds(200);
  o.service.planning_threads = planning_threads;
  o.service.data_root = "/";  // as PlannerProcess: tests name files in TEST_TMPDIR
  auto planner = planner::service::PlannerServer::Start(o);
  REQUIRE(planner.ok());
  s.planner = std::move(*planner);
  return s;
}

}  // namespace dynapipe::testing
