// deploy/slurm/dynapipe.sbatch end to end on this machine: stand-ins for
// scontrol and srun (srun runs its command here, once per task) let the
// script start the real redis-server, dynapipe-planner and executors, submit
// a tiny job and watch it succeed. While it runs: Redis wants the password
// the script generated, binds only the head node's address with protected
// mode on, and the password appears on no command line; the secrets are
// 0600 in a 0700 run directory; nothing runs --insecure.

#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "src/testing/redis_server.h"
#include "src/testing/shell.h"
#include "src/testing/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using dynapipe::testing::ReadAll;
using dynapipe::testing::Runfiles;
using Output = dynapipe::testing::ShellOutput;

Output Shell(const std::string& command) { return dynapipe::testing::RunShell(command); }

void WriteExecutable(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  fs::permissions(path, fs::perms::owner_all);
}

// The permission bits of `path`, -1 if it is missing (no REQUIRE: the
// script still runs on another thread).
int Mode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

// The head node is "localhost"; srun ignores where it is told to run and
// starts --ntasks-per-node copies (SLURM_LOCALID 0..n-1), forwarding SIGTERM.
// It refuses what a real Slurm 22.05 (deploy/slurm/local-slurm-test.sh)
// runs wrongly: a step without --overlap (it would wait for the steps
// before it), task counts left to the batch step's SLURM_NTASKS (one task
// per node), and --gres=none beside a GPU request in the environment
// ("Invalid Trackable RESource").
constexpr char kScontrol[] = R"(#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && echo localhost
)";
constexpr char kSrun[] = R"(#!/usr/bin/env bash
n=1 ntasks="" overlap=0 gres=""
while [ $# -gt 0 ]; do
  case "$1" in
    -w) shift 2 ;;
    --ntasks-per-node=*) n="${1#*=}"; shift ;;
    --ntasks=*) ntasks="${1#*=}"; shift ;;
    --overlap) overlap=1; shift ;;
    --gres=*) gres="${1#*=}"; shift ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $overlap = 1 ] || { echo "fake srun: no --overlap: $*" >&2; exit 1; }
[ "$ntasks" = "$n" ] || { echo "fake srun: --ntasks='$ntasks' for $n tasks on one node: $*" >&2; exit 1; }
if [ "$gres" = none ] && env | grep -q '^SLURM_[A-Z_]*GPU'; then
  echo "fake srun: --gres=none with a GPU request in the environment: $*" >&2; exit 1
fi
pids=()
for i in $(seq 0 $((n - 1))); do SLURM_LOCALID=$i "$@" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null; wait' TERM INT
wait
)";


TEST_CASE("The Slurm script runs a job with a password-protected Redis on the head node and 0600 secrets") {
  const std::string work = dynapipe::testing::FreshTempDir("slurm");
  const std::string fake_bin = work + "/fakebin";
  const std::string run = work + "/run";
  fs::create_directories(fake_bin);
  WriteExecutable(fake_bin + "/scontrol", kScontrol);
  WriteExecutable(fake_bin + "/srun", kSrun);
  const std::string cli = Runfiles() + "/cli/dynapipe";
  const std::string lengths = Runfiles() + "/tests/data/flan-like-lengths.txt";
  const Output synth = Shell("cd '" + work + "' && '" + cli + "' data synth --out data/ds --lengths '" + lengths +
                             "' --samples 300 --input-scale 0.125 --alphabet 8 --seed 1");
  INFO(synth.text);
  REQUIRE(synth.rc == 0);
  fs::copy_file(Runfiles() + "/deploy/slurm/test-job.pbtxt", work + "/job.pbtxt");

  auto port = [] {
    auto p = dynapipe::testing::PickFreeLoopbackPort();
    REQUIRE(p.ok());
    return std::to_string(*p);
  };
  const std::string redis_port = port(), planner_port = port(), http_port = port();
  const std::string command = "cd '" + work + "' && env PATH='" + fake_bin + "':\"$PATH\" SLURM_JOB_ID=7 " +
                              "SLURM_JOB_NODELIST=localhost SLURM_GPUS_PER_NODE=2 SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 " +
                              "DYNAPIPE_BACKEND=cpu OPENBLAS_NUM_THREADS=1 " +
                              "DYNAPIPE_BIN='" + Runfiles() + "' DYNAPIPE_RUN_DIR='" + run + "' REDIS_PORT=" +
                              redis_port + " PLANNER_PORT=" + planner_port + " HTTP_PORT=" + http_port +
                              " timeout -s TERM 240 bash '" + Runfiles() + "/deploy/slurm/dynapipe.sbatch' job.pbtxt";
  Output script;
  std::thread runner([&] { script = Shell(command); });

  // Redis is up once it answers the generated password.
  const std::string redis_cli = "redis-cli -h 127.0.0.1 -p " + redis_port;
  std::string password;
  Output pong;
  for (int i = 0; i < 300 && pong.text.find("PONG") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    password = ReadAll(run + "/redis.password");
    if (!password.empty()) pong = Shell(redis_cli + " --no-auth-warning -a '" + password + "' ping");
  }
  CHECK(password.size() == 64);
  CHECK_THAT(pong.text, Contains("PONG"));
  const std::string with_auth = redis_cli + " --no-auth-warning -a '" + password + "' ";
  CHECK_THAT(Shell(redis_cli + " ping").text, Contains("NOAUTH"));
  CHECK_THAT(Shell(redis_cli + " --no-auth-warning -a wrong ping").text, !Contains("PONG"));
  CHECK(Shell(with_auth + "config get bind").text == "bind\n127.0.0.1\n");
  CHECK(Shell(with_auth + "config get protected-mode").text == "protected-mode\nyes\n");
  const Output ps = Shell("ps -eo args");
  CHECK_THAT(ps.text, Contains("redis-server"));
  CHECK_THAT(ps.text, !Contains(password));
  CHECK_THAT(ps.text, !Contains(ReadAll(run + "/token")));
  CHECK(Mode(run) == 0700);
  for (const char* secret : {"token", "redis.password", "redis.conf"}) {
    INFO(secret);
    CHECK(Mode(run + "/" + secret) == 0600);
  }

  runner.join();
  INFO(script.text);
  CHECK(script.rc == 0);
  CHECK_THAT(script.text, Contains("2 cpu executors (2 per node on localhost)"));
  CHECK_THAT(script.text, Contains("submitted ") && Contains("status: http://127.0.0.1:" + http_port + "/status"));
  const std::string planner_log = ReadAll(run + "/planner.log");
  CHECK_THAT(planner_log, !Contains("INSECURE") && Contains("serving gRPC"));
  // The script stops what it started.
  CHECK_THAT(Shell(with_auth + "ping").text, !Contains("PONG"));
  CHECK_THAT(Shell("ps -eo args").text, !Contains(run));
}

}  // namespace
