// The quickstart's path (deploy/local-cluster.sh, `dynapipe submit`, then
// `dynapipe watch`, whose exit status the quickstart reports) through a
// planner restart mid-job (local-cluster.sh restart-planner): the job
// succeeds and watch ends 0 on its final line, each line printed once.
// The quickstart's own job file, on a small dataset and 120 iterations, with
// its cost profile measured first as the quickstart does.

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "src/testing/shell.h"
#include "src/testing/temp_dir.h"

namespace {

using Catch::Matchers::Contains;
using dynapipe::testing::Runfiles;

constexpr char kScript[] = R"SH(
set -euo pipefail
repo=$1 tmp=$2
cd "$tmp"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export DYNAPIPE_BIN="$repo" DYNAPIPE_RUN_DIR="$tmp/cluster" DYNAPIPE_DATA_ROOT="$tmp" OPENBLAS_NUM_THREADS=1
export DYNAPIPE_REDIS_PORT=$(free_port) DYNAPIPE_PLANNER_PORT=$(free_port) DYNAPIPE_HTTP_PORT=$(free_port)
cli="$repo/cli/dynapipe"
timeout 60 "$cli" data synth --out data/quickstart --lengths "$repo/tests/data/flan-like-lengths.txt" --samples 2000 \
  --input-scale 0.125 --alphabet 8 --seed 1 > synth.log
sed 's/^iterations: 600$/iterations: 120/' "$repo/configs/jobs/quickstart.pbtxt" > job.pbtxt
grep -q '^iterations: 120$' job.pbtxt || { echo "configs/jobs/quickstart.pbtxt has no 'iterations: 600' line"; exit 1; }
# The cost profile the job plans with, measured as deploy/quickstart.sh does.
timeout 120 "$cli" profile --job job.pbtxt --out data/quickstart-profile.json --data-root . > profile.log 2>&1 ||
  { cat profile.log; exit 1; }
trap 'bash "$repo/deploy/local-cluster.sh" stop > /dev/null 2>&1 || true' EXIT
bash "$repo/deploy/local-cluster.sh" start --executors 4 > start.log
export DYNAPIPE_PLANNER="127.0.0.1:$DYNAPIPE_PLANNER_PORT" DYNAPIPE_TOKEN_FILE="$tmp/cluster/token"
job=$("$cli" submit job.pbtxt)
timeout 300 "$cli" watch "$job" > watch.log 2>&1 &
watch=$!
for _ in $(seq 600); do
  grep -Eq ' running iteration ([3-9]|[0-9]{2,})/' watch.log && break
  sleep 0.2
done
grep -Eq ' running iteration ([3-9]|[0-9]{2,})/' watch.log || { echo "the job did not reach iteration 3"; cat watch.log; exit 1; }
bash "$repo/deploy/local-cluster.sh" restart-planner
echo "restarted at: $(grep ' running iteration ' watch.log | tail -n 1 | cut -d'|' -f1)"
wait "$watch" && rc=0 || rc=$?
echo "watch exit status: $rc"
echo "last line: $(tail -n 1 watch.log)"
echo "lines printed twice: $(sort watch.log | uniq -d | wc -l)"
)SH";

TEST_CASE("The quickstart's submit and watch ride through a planner restart: watch ends 0 on the job's last line",
          "[integration]") {
  const std::string tmp = dynapipe::testing::FreshTempDir("local-cluster");
  const std::string script = tmp + "/test.sh";
  std::filesystem::create_directories(tmp);
  {
    FILE* f = std::fopen(script.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(kScript, f);
    std::fclose(f);
  }
  const dynapipe::testing::ShellOutput out =
      dynapipe::testing::RunShell("bash '" + script + "' '" + Runfiles() + "' '" + tmp + "'");
  INFO(out.text);
  REQUIRE(out.rc == 0);
  CHECK_THAT(out.text, Contains("local-cluster: planner restarted"));
  CHECK_THAT(out.text, Contains("watch exit status: 0"));
  CHECK_THAT(out.text, Contains("succeeded iteration 120/120"));
  CHECK_THAT(out.text, Contains("lines printed twice: 0"));
}

}  // namespace
