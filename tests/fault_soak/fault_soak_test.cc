// The fault soak: a real Redis (with its append-only file), a
// dynapipe-planner process and 4 dynapipe-executor processes train a small
// 2 x 2 job over and over on loopback; during each run one process gets one
// signal, chosen at random from {executor, planner, Redis} x {SIGKILL,
// SIGSTOP, SIGTERM}:
//
// - an executor fault must fail the job within the deadline, naming a rank;
//   the executor is replaced and a resume must end bit-identically to an
//   undisturbed run;
// - a planner or Redis fault lasting 1-20 s, often past the 3 s heartbeat
//   timeout (restart on the same address, or SIGCONT), and a SIGSTOP of 40 s
//   of either, must be ridden through: the job ends bit-identically without
//   a resume.
//
// Around every fault, what users see: a `dynapipe watch` runs through each
// job and must end 0 on a ridden-through fault (non-zero on a job that
// failed); `dynapipe status` during each Redis outage must answer within
// 1 s; a daemon sent SIGTERM (the fault, and every daemon at the end) must
// exit within 2 s.
//
// A hang is a job that neither ends nor fails within a generous limit; a
// crash is any daemon that exits without being the fault's target. Prints a
// table per fault kind (also to $DYNAPIPE_SOAK_REPORT). Sized by
// $DYNAPIPE_SOAK_RUNS (default 11: each kind once, the CI version),
// $DYNAPIPE_SOAK_KINDS (only the kinds whose name contains it),
// $DYNAPIPE_SOAK_SEED and $DYNAPIPE_SOAK_SECONDS (no new run after it).
// deploy/soak.sh runs the long version.

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/checkpoint/checkpoint.h"
#include "src/testing/shell.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

constexpr int kIterations = 30;
constexpr int kInterval = 5;
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(3);
// An executor fault is detected within the heartbeat timeout plus the
// planner's next liveness pass and the client's poll.
const absl::Duration kDetectionDeadline = kHeartbeatTimeout + absl::Seconds(3);
constexpr absl::Duration kRunLimit = absl::Seconds(120);  // past this a job is a hang
constexpr absl::Duration kLongStop = absl::Seconds(40);  // the long SIGSTOP kinds
constexpr double kStatusLimitS = 1.0;                      // `dynapipe status` during a Redis outage
constexpr double kExitLimitS = 2.0;                        // SIGTERM to exit

enum class Target { kExecutor, kPlanner, kRedis };
const char* Name(Target t) { return t == Target::kExecutor ? "executor" : t == Target::kPlanner ? "planner" : "Redis"; }
const char* SignalName(int sig) { return sig == SIGKILL ? "SIGKILL" : sig == SIGSTOP ? "SIGSTOP" : "SIGTERM"; }

struct Kind {
  Target target;
  int sig;
  bool long_stop = false;  // SIGSTOP for kLongStop instead of 1-20 s
  std::string name() const {
    return absl::StrCat(Name(target), " ", SignalName(sig), long_stop ? " 40 s" : "");
  }
};

struct Tally {
  int runs = 0, detected = 0, rode_through = 0, hangs = 0, bit_identical = 0, crashes = 0;
  int watch_ok = 0;                       // watch ended as the job did (0 iff it succeeded)
  int status_checked = 0, status_ok = 0;  // status during a Redis outage, within kStatusLimitS
  std::vector<double> detection_s, exit_s, status_s;
};

std::string Cli() { return RunfilesRoot() + "/cli/dynapipe"; }

// `dynapipe watch JOB` as a child process (output into `out`).
std::unique_ptr<ChildProcess> StartWatch(const std::string& address, const std::string& job, const std::string& out) {
  return std::make_unique<ChildProcess>(std::vector<std::string>{
      "/bin/sh", "-c", absl::StrCat("exec ", Cli(), " watch ", job, " --planner ", address, " >", out, " 2>&1")});
}

// The watch's exit status once it ended (-1: still running after 15 s, then killed).
int WatchExit(ChildProcess* watch) {
  if (!watch->Exited(absl::Seconds(15))) {
    watch->Signal(SIGKILL);
    (void)watch->Exited(absl::Seconds(5));
    return -1;
  }
  return WIFEXITED(watch->wait_status()) ? WEXITSTATUS(watch->wait_status()) : -1;
}

// Seconds from SIGTERM to exit (-1: still there after 20 s).
template <typename Process>
double SecondsToExit(Process& p) {
  const absl::Time start = absl::Now();
  p.Signal(SIGTERM);
  return p.Exited(absl::Seconds(20)) ? absl::ToDoubleSeconds(absl::Now() - start) : -1;
}

std::string MedianMax(std::vector<double> v) {
  if (v.empty()) return "—";
  std::sort(v.begin(), v.end());
  return absl::StrFormat("%.2f s / %.2f s", v[v.size() / 2], v.back());
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

bool Terminal(proto::JobState::Value s) {
  return s == proto::JobState::succeeded || s == proto::JobState::failed || s == proto::JobState::cancelled;
}

// Redis, a planner on a fixed address, and 4 executors (index = device).
class Cluster {
 public:
  Cluster() {
    auto redis = RedisServer::Start(absl::Seconds(10), /*persistent=*/true);
    REQUIRE(redis.ok());
    redis_ = std::move(*redis);
    REQUIRE(StartPlanner(""));
    address_ = planner_->address();
    client_ = Client(address_);
    executors_.resize(4);
    for (int d = 0; d < 4; ++d) ReplaceExecutor(d);
  }

  bool StartPlanner(const std::string& address) {
    std::vector<std::string> flags = {absl::StrCat("--heartbeat_timeout_ms=", absl::ToInt64Milliseconds(kHeartbeatTimeout)),
                                      "--lease_ttl_ms=3000"};
    if (!address.empty()) flags.push_back("--listen=" + address);
    auto p = PlannerProcess::Start(redis_->port(), flags);
    if (!p.ok()) return false;
    planner_ = std::move(*p);
    return true;
  }

  rpc::PlannerClient* client() { return client_.get(); }
  RedisServer& redis() { return *redis_; }
  PlannerProcess& planner() { return *planner_; }
  ChildProcess& executor(int d) { return *executors_[d]; }
  // As deployed: transfers and collectives wait as long as a planner outage
  // is ridden through (--comm-timeout-s = --planner-grace-s = 60): a rank
  // waiting for its next plan holds its peers in a collective meanwhile.
  void ReplaceExecutor(int d) {
    ExecutorProcessOptions o;
    o.planner = address_;
    o.device = d;
    o.comm_timeout_s = 60;
    executors_[d] = StartExecutor(o);
  }
  bool RestartPlanner() { return StartPlanner(address_); }

  // Daemons that exited though no fault was aimed at them (restarted, so
  // the next run starts whole). `victim_*` name the one that was aimed at.
  int CountCrashes(Target target, int victim_device) {
    int crashes = 0;
    for (int d = 0; d < 4; ++d) {
      if (target == Target::kExecutor && d == victim_device) continue;
      if (executors_[d]->Exited(absl::ZeroDuration())) {
        WARN("executor " << d << " exited unasked (wait status " << executors_[d]->wait_status() << ")");
        ++crashes;
        ReplaceExecutor(d);
      }
    }
    if (target != Target::kPlanner && planner_->Exited(absl::ZeroDuration())) {
      WARN("the planner exited unasked (wait status " << planner_->wait_status() << ")");
      ++crashes;
      REQUIRE(RestartPlanner());
    }
    int status = 0;
    if (target != Target::kRedis && ::waitpid(redis_->pid(), &status, WNOHANG) == redis_->pid()) {
      WARN("Redis exited unasked (wait status " << status << ")");
      ++crashes;
      REQUIRE(redis_->Restart().ok());
    }
    return crashes;
  }

  // An idle executor on each of the 4 devices, heartbeating now (a dead
  // one's record stays unlost for a heartbeat timeout).
  bool Settled(absl::Duration limit) {
    return Eventually(
        [&] {
          auto list = client_->Executors();
          if (!list.ok()) return false;
          const int64_t now = absl::ToUnixMillis(absl::Now());
          std::set<int> devices;
          for (const auto& e : list->executors()) {
            if (!e.lost() && e.assignment().job_id().empty() && now - e.last_heartbeat_unix_ms() < 1500) {
              devices.insert(e.info().device_index());
            }
          }
          return devices.size() == 4;
        },
        limit);
  }

 private:
  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<PlannerProcess> planner_;
  std::string address_;
  std::unique_ptr<rpc::PlannerClient> client_;
  std::vector<std::unique_ptr<ChildProcess>> executors_;
};

// The device of the executor holding `rank` of `job`, -1 if unknown.
int DeviceOfRank(rpc::PlannerClient* client, const std::string& job, int rank) {
  auto list = client->Executors();
  if (!list.ok()) return -1;
  for (const auto& e : list->executors()) {
    if (e.assignment().job_id() == job && e.assignment().rank() == rank && !e.lost()) return e.info().device_index();
  }
  return -1;
}

bool SameAsReference(const std::string& dir, const std::string& reference) {
  for (int r = 0; r < 4; ++r) {
    const std::vector<float> got = Params(dir, kIterations - 1, r);
    if (got.empty() || got != Params(reference, kIterations - 1, r)) return false;
  }
  return true;
}

std::string Table(const std::map<std::string, Tally>& tallies, const std::vector<std::string>& order,
                  const std::vector<double>& final_exit_s) {
  std::string out =
      "| fault | runs | detected within deadline | detection median / max | rode through | hangs | resumes or "
      "endings bit-identical | crashes | watch ended right | status in outage ≤ 1 s | SIGTERM to exit median / max "
      "|\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  Tally total;
  for (const std::string& kind : order) {
    auto it = tallies.find(kind);
    if (it == tallies.end()) continue;
    const Tally& t = it->second;
    const bool executor = kind.rfind("executor", 0) == 0;
    absl::StrAppend(
        &out, absl::StrFormat("| %s | %d | %s | %s | %s | %d | %d of %d | %d | %d of %d | %s | %s |\n", kind, t.runs,
                              executor ? absl::StrCat(t.detected, " of ", t.runs) : "—",
                              executor ? MedianMax(t.detection_s) : "—",
                              executor ? "—" : absl::StrCat(t.rode_through, " of ", t.runs), t.hangs, t.bit_identical,
                              t.runs, t.crashes, t.watch_ok, t.runs,
                              t.status_checked > 0
                                  ? absl::StrCat(t.status_ok, " of ", t.status_checked, " (max ",
                                                 absl::StrFormat("%.2f", *std::max_element(t.status_s.begin(),
                                                                                          t.status_s.end())),
                                                 " s)")
                                  : "—",
                              MedianMax(t.exit_s)));
    total.runs += t.runs;
    total.hangs += t.hangs;
    total.bit_identical += t.bit_identical;
    total.crashes += t.crashes;
    total.watch_ok += t.watch_ok;
    total.status_checked += t.status_checked;
    total.status_ok += t.status_ok;
  }
  absl::StrAppend(&out, absl::StrFormat("| all | %d | | | | %d | %d of %d | %d | %d of %d | %d of %d | |\n",
                                        total.runs, total.hangs, total.bit_identical, total.runs, total.crashes,
                                        total.watch_ok, total.runs, total.status_ok, total.status_checked));
  absl::StrAppend(&out, "\nAt the end every daemon got SIGTERM: planner and 4 executors exited in ",
                  MedianMax(final_exit_s), " (median / max).\n");
  return out;
}

TEST_CASE("Fault soak: executor faults are detected and resumed, planner and Redis faults ridden through") {
  const int runs = std::max(1, EnvInt("DYNAPIPE_SOAK_RUNS", 11));
  const unsigned seed = static_cast<unsigned>(EnvInt("DYNAPIPE_SOAK_SEED", static_cast<int>(::time(nullptr) % 100000)));
  const absl::Duration budget = absl::Seconds(EnvInt("DYNAPIPE_SOAK_SECONDS", 600));
  std::mt19937 rng(seed);
  const absl::Time start = absl::Now();

  const std::string tmp = TmpDir() + "/fault-soak";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  Cluster cluster;
  rpc::PlannerClient* client = cluster.client();

  const std::string reference = tmp + "/reference";
  {
    auto job = client->Submit(TrainJob(kIterations, reference, kInterval));
    REQUIRE(job.ok());
    const proto::JobStatus s = WaitEnded(client, *job, kRunLimit);
    INFO(s.error());
    REQUIRE(s.state() == proto::JobState::succeeded);
  }

  std::vector<Kind> kinds;
  for (Target t : {Target::kExecutor, Target::kPlanner, Target::kRedis}) {
    for (int sig : {SIGKILL, SIGSTOP, SIGTERM}) kinds.push_back({t, sig});
  }
  kinds.push_back({Target::kPlanner, SIGSTOP, true});
  kinds.push_back({Target::kRedis, SIGSTOP, true});
  // $DYNAPIPE_SOAK_KINDS ("planner SIGSTOP", "Redis"): only the kinds whose name contains it.
  if (const char* only = std::getenv("DYNAPIPE_SOAK_KINDS"); only != nullptr && *only != '\0') {
    std::erase_if(kinds, [&](const Kind& k) { return k.name().find(only) == std::string::npos; });
    REQUIRE(!kinds.empty());
  }
  std::vector<std::string> order;
  for (const Kind& k : kinds) order.push_back(k.name());
  std::map<std::string, Tally> tallies;
  std::vector<Kind> round;
  int ran = 0;
  const std::string address = cluster.planner().address();
  for (int run = 0; run < runs && absl::Now() - start < budget; ++run, ++ran) {
    if (round.empty()) {  // every kind once per round, in a random order
      round = kinds;
      std::shuffle(round.begin(), round.end(), rng);
    }
    const Kind k = round.back();
    round.pop_back();
    const Target target = k.target;
    const int sig = k.sig;
    const std::string kind = k.name();
    Tally& tally = tallies[kind];
    ++tally.runs;
    const absl::Duration outage = k.long_stop ? kLongStop : absl::Milliseconds(1000 + rng() % 19000);
    const int after = 2 + static_cast<int>(rng() % (kIterations / 2 - 2));
    const std::string dir = absl::StrCat(tmp, "/run-", run);
    proto::JobSpec spec = TrainJob(kIterations, dir, kInterval);
    auto job = client->Submit(spec);
    REQUIRE(job.ok());
    auto watch = StartWatch(address, *job, absl::StrCat(tmp, "/watch-", run, ".out"));
    REQUIRE(Eventually(
        [&] {
          auto s = client->Get(*job);
          return s.ok() && (s->iterations_done() >= after || Terminal(s->state()));
        },
        kRunLimit));
    int victim = -1;
    std::string what;
    const absl::Time fault_at = absl::Now();
    if (target == Target::kExecutor) {
      const int rank = static_cast<int>(rng() % 4);
      victim = DeviceOfRank(client, *job, rank);
      REQUIRE(victim >= 0);
      cluster.executor(victim).Signal(sig);
      absl::Time exited_at = absl::InfiniteFuture();
      if (sig == SIGTERM && cluster.executor(victim).Exited(absl::Seconds(20))) exited_at = absl::Now();
      const proto::JobStatus s = WaitEnded(client, *job, kRunLimit);
      const int watched = WatchExit(watch.get());
      tally.watch_ok += Terminal(s.state()) && watched == (s.state() == proto::JobState::succeeded ? 0 : 1);
      absl::StrAppend(&what, "watch exit ", watched, "; ");
      const absl::Duration took = absl::Now() - fault_at;
      if (!Terminal(s.state())) {
        ++tally.hangs;
        (void)client->Cancel(*job);
        what = "hang";
      } else if (s.state() == proto::JobState::failed && s.error().rfind(absl::StrCat("rank ", rank, " "), 0) == 0) {
        tally.detection_s.push_back(absl::ToDoubleSeconds(took));
        tally.detected += took <= kDetectionDeadline;
        absl::StrAppend(&what, absl::StrFormat("failed after %.2f s: %s", absl::ToDoubleSeconds(took), s.error()));
      } else {
        absl::StrAppend(&what, "ended ", proto::JobState::Value_Name(s.state()), ": ", s.error());
      }
      // The victim goes (a stopped one is killed), a new one takes its place.
      if (sig == SIGSTOP) cluster.executor(victim).Signal(SIGKILL);
      if (!cluster.executor(victim).Exited(absl::Seconds(20))) {
        ++tally.hangs;
        what += "; the executor did not exit";
        cluster.executor(victim).Signal(SIGKILL);
        (void)cluster.executor(victim).Exited(absl::Seconds(5));
      } else if (sig == SIGTERM && !(WIFEXITED(cluster.executor(victim).wait_status()) &&
                                     WEXITSTATUS(cluster.executor(victim).wait_status()) <= 1)) {
        ++tally.crashes;
        what += absl::StrCat("; SIGTERMed executor ended with wait status ", cluster.executor(victim).wait_status());
      }
      if (sig == SIGTERM) tally.exit_s.push_back(absl::ToDoubleSeconds(exited_at - fault_at));
      cluster.ReplaceExecutor(victim);
      if (cluster.Settled(absl::Seconds(30)) && s.state() == proto::JobState::failed) {
        spec.mutable_checkpoint()->set_resume(true);
        auto again = client->Submit(spec);
        if (again.ok()) {
          auto watch_again = StartWatch(address, *again, absl::StrCat(tmp, "/watch-", run, "-resume.out"));
          const proto::JobStatus r = WaitEnded(client, *again, kRunLimit);
          (void)WatchExit(watch_again.get());
          if (!Terminal(r.state())) {
            ++tally.hangs;
            (void)client->Cancel(*again);
          }
          tally.bit_identical += r.state() == proto::JobState::succeeded && SameAsReference(dir, reference);
        } else {  // counted as a resume that is not bit-identical
          absl::StrAppend(&what, "; resume refused: ", again.status().message());
        }
      }
    } else {
      const bool planner = target == Target::kPlanner;
      const pid_t pid = planner ? cluster.planner().pid() : cluster.redis().pid();
      ::kill(pid, sig);
      const absl::Time outage_ends = absl::Now() + outage;
      // Users ask during a Redis outage: the planner answers, from what it last knew.
      auto check_status = [&] {
        if (planner) return;
        absl::SleepFor(absl::Milliseconds(500));
        const absl::Time asked = absl::Now();
        const ShellOutput st = RunShell(absl::StrCat(Cli(), " status ", *job, " --planner ", address));
        const double took = absl::ToDoubleSeconds(absl::Now() - asked);
        ++tally.status_checked;
        tally.status_s.push_back(took);
        tally.status_ok += st.rc == 0 && took <= kStatusLimitS;
        absl::StrAppend(&what, absl::StrFormat("status in %.2f s (exit %d); ", took, st.rc));
      };
      bool restarted = true;
      if (sig == SIGSTOP) {
        check_status();
        absl::SleepFor(outage_ends - absl::Now());
        ::kill(pid, SIGCONT);
      } else if (planner) {
        const absl::Time signalled = absl::Now();
        if (!cluster.planner().Exited(absl::Seconds(20))) {
          ++tally.hangs;
          what = "the planner did not exit; ";
          cluster.planner().Signal(SIGKILL);
          (void)cluster.planner().Exited(absl::Seconds(5));
        } else if (sig == SIGTERM && cluster.planner().wait_status() != 0) {
          ++tally.crashes;
          what = absl::StrCat("SIGTERMed planner ended with wait status ", cluster.planner().wait_status(), "; ");
        } else if (sig == SIGTERM) {
          tally.exit_s.push_back(absl::ToDoubleSeconds(absl::Now() - signalled));
        }
        absl::SleepFor(outage_ends - absl::Now());
        restarted = cluster.RestartPlanner();
      } else {
        check_status();
        absl::SleepFor(outage_ends - absl::Now());
        restarted = cluster.redis().Restart().ok();  // reaps the old process, starts on its AOF
      }
      REQUIRE(restarted);
      const proto::JobStatus s = WaitEnded(client, *job, kRunLimit);
      if (!Terminal(s.state())) {
        ++tally.hangs;
        (void)client->Cancel(*job);
      }
      const int watched = WatchExit(watch.get());
      tally.watch_ok += Terminal(s.state()) && watched == (s.state() == proto::JobState::succeeded ? 0 : 1);
      absl::StrAppend(&what, "watch exit ", watched, "; ");
      const bool rode = s.state() == proto::JobState::succeeded;
      tally.rode_through += rode;
      tally.bit_identical += rode && SameAsReference(dir, reference);
      absl::StrAppend(&what, proto::JobState::Value_Name(s.state()), " ", s.error());
    }
    tally.crashes += cluster.CountCrashes(target, victim);
    std::printf("run %d: %s (outage %.1f s, after iteration %d): %s\n", run, kind.c_str(),
                absl::ToDoubleSeconds(outage), after, what.c_str());
    std::fflush(stdout);
    if (!cluster.Settled(absl::Seconds(30))) {
      WARN("run " << run << ": the executors did not all come back idle within 30 s");
    }
    std::filesystem::remove_all(dir);
  }

  // Every daemon stops on SIGTERM within kExitLimitS.
  std::vector<double> final_exit_s;
  for (int d = 0; d < 4; ++d) final_exit_s.push_back(SecondsToExit(cluster.executor(d)));
  final_exit_s.push_back(SecondsToExit(cluster.planner()));
  const std::string table = Table(tallies, order, final_exit_s);
  const std::string footer = absl::StrFormat("seed %u, %d runs, %.0f s\n", seed, ran,
                                             absl::ToDoubleSeconds(absl::Now() - start));
  std::printf("\n%s\n%s", table.c_str(), footer.c_str());
  if (const char* report = std::getenv("DYNAPIPE_SOAK_REPORT"); report != nullptr && *report != '\0') {
    std::ofstream(report) << table << "\n" << footer;
  }
  for (double e : final_exit_s) {
    CHECK(e >= 0);
    CHECK(e <= kExitLimitS);
  }
  for (const std::string& kind : order) {
    auto it = tallies.find(kind);
    if (it == tallies.end()) continue;
    const Tally& t = it->second;
    INFO(kind);
    CHECK(t.hangs == 0);
    CHECK(t.crashes == 0);
    CHECK(t.bit_identical == t.runs);
    CHECK(t.watch_ok == t.runs);
    CHECK(t.status_ok == t.status_checked);
    for (double e : t.exit_s) CHECK(e <= kExitLimitS);
    if (kind.rfind("executor", 0) == 0) {
      CHECK(t.detected == t.runs);
    } else {
      CHECK(t.rode_through == t.runs);
    }
  }
}

}  // namespace
}  // namespace dynapipe::testing
