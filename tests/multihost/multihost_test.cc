// Training across hosts, on real network stacks: three network namespaces
// joined by veth links stand for three machines. host0 runs Redis and the
// planner and routes between the other two; host1 and host2 each run two
// executors that reach each other only through host0 (a routed network, not
// loopback). The test's own process (the root namespace) is the operator's
// machine, with a link to host0 only.
//
//   root 10.213.0.1 --- 10.213.0.2 host0 10.213.1.1 --- 10.213.1.2 host1
//                                        10.213.2.1 --- 10.213.2.2 host2
//
// A 2 x 2 job trained across host1 and host2 ends with the same parameters
// as on one host. Then a partition (host0 stops forwarding between host1 and
// host2, while both still reach the planner) must fail the job within the
// communication deadline naming an unreachable rank, and once the network
// is back a resume must end bit-identically. Needs root (ip netns); where
// namespaces cannot be made the test says so and does not run.

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "src/checkpoint/checkpoint.h"
#include "src/testing/shell.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

using Catch::Matchers::Contains;

constexpr int kCommTimeoutS = 5;
constexpr int kIterations = 60;
constexpr int kInterval = 5;

// The three namespaces and their links, named after this process so that
// concurrent runs do not collide; removed (with whatever runs inside them
// killed first by the processes' owners) when destroyed.
class Hosts {
 public:
  Hosts() : tag_(std::to_string(::getpid() % 100000)) {}
  ~Hosts() {
    for (int h = 0; h < 3; ++h) RunShell("ip netns del " + ns(h) + " 2>/dev/null");
    RunShell("ip link del " + link(0, 'r') + " 2>/dev/null");
  }
  std::string ns(int host) const { return absl::StrCat("dp", tag_, "h", host); }
  // Interface names: at most 15 bytes.
  std::string link(int n, char side) const { return absl::StrCat("dp", tag_, "l", n, std::string(1, side)); }
  // A command prefix that runs inside `host` (ChildProcess execs a path).
  std::vector<std::string> exec(int host) const { return {ip_, "netns", "exec", ns(host)}; }

  // Empty when the network is up; else why it could not be made.
  std::string Create() {
    const ShellOutput ip = RunShell("command -v ip");
    if (ip.rc != 0) return "no ip command (iproute2)";
    ip_ = ip.text.substr(0, ip.text.find('\n'));
    std::string script = "set -e\n";
    for (int h = 0; h < 3; ++h) {
      absl::StrAppend(&script, "ip netns add ", ns(h), "\nip -n ", ns(h), " link set lo up\n");
    }
    // root <-> host0
    absl::StrAppend(&script, "ip link add ", link(0, 'r'), " type veth peer name ", link(0, 'h'), " netns ", ns(0), "\n",
                    "ip addr add 10.213.0.1/24 dev ", link(0, 'r'), "\nip link set ", link(0, 'r'), " up\n",
                    "ip -n ", ns(0), " addr add 10.213.0.2/24 dev ", link(0, 'h'), "\n", "ip -n ", ns(0),
                    " link set ", link(0, 'h'), " up\n");
    // host0 <-> host1, host0 <-> host2, each with its default route through host0
    for (int h = 1; h <= 2; ++h) {
      absl::StrAppend(&script, "ip link add ", link(h, 'a'), " netns ", ns(0), " type veth peer name ", link(h, 'b'),
                      " netns ", ns(h), "\n", "ip -n ", ns(0), " addr add 10.213.", h, ".1/24 dev ", link(h, 'a'),
                      "\n", "ip -n ", ns(0), " link set ", link(h, 'a'), " up\n", "ip -n ", ns(h), " addr add 10.213.",
                      h, ".2/24 dev ", link(h, 'b'), "\n", "ip -n ", ns(h), " link set ", link(h, 'b'), " up\n",
                      "ip -n ", ns(h), " route add default via 10.213.", h, ".1\n");
    }
    absl::StrAppend(&script, "ip netns exec ", ns(0), " sysctl -qw net.ipv4.ip_forward=1\n");
    const ShellOutput out = RunShell("bash -c '" + script + "' 2>&1");
    return out.rc == 0 ? "" : out.text;
  }

  // Forwarding on host0 between host1 and host2: off is a partition between
  // the executors of the two hosts; each still reaches host0.
  bool SetRouting(bool on) {
    return RunShell(absl::StrCat("ip netns exec ", ns(0), " sysctl -qw net.ipv4.ip_forward=", on ? 1 : 0)).rc == 0;
  }

 private:
  std::string tag_;
  std::string ip_;
};

std::unique_ptr<ChildProcess> Spawn(std::vector<std::string> prefix, const std::vector<std::string>& argv) {
  prefix.insert(prefix.end(), argv.begin(), argv.end());
  return std::make_unique<ChildProcess>(prefix,
                                        std::vector<std::pair<std::string, std::string>>{{"OPENBLAS_NUM_THREADS", "1"}});
}

// Trains the job and returns its final status.
proto::JobStatus Train(rpc::PlannerClient* client, const proto::JobSpec& spec) {
  auto job = client->Submit(spec);
  REQUIRE(job.ok());
  return WaitEnded(client, *job, absl::Seconds(180));
}

TEST_CASE("A 2 x 2 job across two hosts trains as on one (a GPT and a T5); a partition fails it naming a rank; "
          "resume is bit-identical") {
  if (::geteuid() != 0) {
    WARN("skipped: network namespaces need root (ip netns); the multi-host test did not run");
    return;
  }
  Hosts hosts;
  if (const std::string why = hosts.Create(); !why.empty()) {
    WARN("skipped: cannot make network namespaces here (ip netns, veth): " << why);
    return;
  }
  const std::string tmp = TmpDir() + "/multihost";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  const std::string dataset = Dataset();  // made here, read by every host (one file system)

  // The single-host references: the same jobs (a GPT, a T5) on loopback.
  const std::string reference = tmp + "/ckpt-one-host", t5_reference = tmp + "/ckpt-t5-one-host";
  proto::JobStatus one_host, t5_one_host;
  {
    Stack stack = StartStack("", absl::Seconds(5));
    auto client = Client(stack.address());
    std::vector<std::unique_ptr<ChildProcess>> executors;
    for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
    one_host = Train(client.get(), TrainJob(kIterations, reference, kInterval));
    INFO(one_host.error());
    REQUIRE(one_host.state() == proto::JobState::succeeded);
    t5_one_host = Train(client.get(), T5TrainJob(kIterations, t5_reference, kInterval));
    INFO(t5_one_host.error());
    REQUIRE(t5_one_host.state() == proto::JobState::succeeded);
    for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
  }

  // host0: Redis and the planner (every interface, so a token).
  const std::string token = tmp + "/token";
  std::ofstream(token) << "multihost-token\n";
  REQUIRE(::chmod(token.c_str(), 0600) == 0);
  auto redis = Spawn(hosts.exec(0), {"redis-server", "--port", "6379", "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--logfile", tmp + "/redis.log"});
  REQUIRE(Eventually(
      [&] { return RunShell("ip netns exec " + hosts.ns(0) + " redis-cli -p 6379 ping").text == "PONG\n"; },
      absl::Seconds(10)));
  const std::string port_file = tmp + "/planner.port";
  auto planner = Spawn(hosts.exec(0), {RunfilesRoot() + "/planner/service/dynapipe-planner", "--listen=0.0.0.0:50051",
                                       "--http_port=8080", "--http_host=0.0.0.0", "--redis=127.0.0.1:6379",
                                       "--token_file=" + token, "--data_root=/", "--heartbeat_timeout_ms=5000",
                                       "--port_file=" + port_file, "--log_file=" + tmp + "/planner.log"});
  REQUIRE(Eventually([&] { return std::filesystem::exists(port_file); }, absl::Seconds(20)));
  auto client = Client("10.213.0.2:50051", "multihost-token");

  // Two executors on each of host1 and host2, each calling the planner at
  // host0's address on its own link; each listens on its own host's address
  // (--listen_address=auto).
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int h = 1; h <= 2; ++h) {
    for (int d = 0; d < 2; ++d) {
      ExecutorProcessOptions o;
      o.planner = absl::StrCat("10.213.", h, ".1:50051");
      o.device = d;
      o.node = absl::StrCat("host", h);
      o.comm_timeout_s = kCommTimeoutS;
      o.prefix = hosts.exec(h);
      o.extra = {"--token_file=" + token};
      o.log_file = absl::StrCat(tmp, "/executor-host", h, "-", d, ".log");
      executors.push_back(StartExecutor(o));
    }
  }
  REQUIRE(Eventually(
      [&] {
        auto list = client->Executors();
        return list.ok() && list->executors_size() == 4;
      },
      absl::Seconds(30)));
  auto list = client->Executors();
  REQUIRE(list.ok());
  for (const auto& e : list->executors()) {
    INFO(e.executor_id());
    CHECK(e.info().address() == absl::StrCat("10.213.", e.info().node() == "host1" ? 1 : 2, ".2"));
  }

  SECTION("trained across hosts, parameters and loss equal the single-host run's") {
    const std::string dir = tmp + "/ckpt-two-hosts";
    const proto::JobStatus two_hosts = Train(client.get(), TrainJob(kIterations, dir, kInterval));
    INFO(two_hosts.error());
    REQUIRE(two_hosts.state() == proto::JobState::succeeded);
    CHECK(two_hosts.last_loss() == one_host.last_loss());
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(Params(dir, kIterations - 1, r) == Params(reference, kIterations - 1, r));
      CHECK(!Params(dir, kIterations - 1, r).empty());
    }
    // A T5 across the hosts: the encoder output crosses them with the
    // decoder's hidden state, the shared tensors are summed across them.
    const std::string t5_dir = tmp + "/ckpt-t5-two-hosts";
    const proto::JobStatus t5 = Train(client.get(), T5TrainJob(kIterations, t5_dir, kInterval));
    INFO(t5.error());
    REQUIRE(t5.state() == proto::JobState::succeeded);
    CHECK(t5.last_loss() == t5_one_host.last_loss());
    for (int r = 0; r < 4; ++r) {
      INFO("T5 rank " << r);
      CHECK(Params(t5_dir, kIterations - 1, r) == Params(t5_reference, kIterations - 1, r));
      CHECK(!Params(t5_dir, kIterations - 1, r).empty());
    }
  }

  SECTION("a partition between the hosts fails the job naming a rank; the resume ends bit-identically") {
    const std::string dir = tmp + "/ckpt-partition";
    proto::JobSpec spec = TrainJob(kIterations, dir, kInterval);
    auto job = client->Submit(spec);
    REQUIRE(job.ok());
    REQUIRE(Eventually([&] { return checkpoint::LatestCompleteOnDisk(dir, 4).value_or(-1) >= kInterval - 1; },
                       absl::Seconds(60)));
    REQUIRE(hosts.SetRouting(false));
    const absl::Time cut = absl::Now();
    const proto::JobStatus failed = WaitEnded(client.get(), *job, absl::Seconds(60));
    const absl::Duration detected = absl::Now() - cut;
    INFO(failed.error());
    REQUIRE(failed.state() == proto::JobState::failed);
    CHECK_THAT(failed.error(), Contains("rank"));
    // Within the communication deadline (plus the report's round trip and
    // the planner's next pass).
    CHECK(detected < absl::Seconds(kCommTimeoutS + 5));
    WARN("partition detected after " << absl::FormatDuration(detected) << ": " << failed.error());

    REQUIRE(hosts.SetRouting(true));
    spec.mutable_checkpoint()->set_resume(true);
    const proto::JobStatus resumed = Train(client.get(), spec);
    INFO(resumed.error());
    REQUIRE(resumed.state() == proto::JobState::succeeded);
    CHECK(resumed.last_loss() == one_host.last_loss());
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(Params(dir, kIterations - 1, r) == Params(reference, kIterations - 1, r));
    }
  }
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

}  // namespace
}  // namespace dynapipe::testing
