// Hostile input end to end (issue 14): a corpus of malformed inputs fed to a
// real dynapipe-planner (real Redis, --data_root a scratch directory filled
// by data_root.cc, a token) and to the `dynapipe` CLI. Every input is
// classified refused / accepted / hang / crash (planner_under_test.h); the
// table per input surface goes to $TEST_UNDECLARED_OUTPUTS_DIR/hostile-inputs.md
// and stdout (deploy/hostile_inputs.sh copies it to docs/hostile-inputs.md).
// Nothing may be accepted, hang or crash; the valid controls must be accepted.
//
// By hand: HOSTILE_VERBOSE=1 prints every input's outcome; HOSTILE_SECTIONS=
// "grpc wire,http" runs only those sections.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "src/testing/redis_server.h"
#include "src/testing/temp_dir.h"
#include "tests/hostile/checkpoint_corpus.h"
#include "tests/hostile/data_root.h"
#include "tests/hostile/feed_files.h"
#include "tests/hostile/feed_grpc.h"
#include "tests/hostile/feed_network.h"
#include "tests/hostile/job_corpus.h"
#include "tests/hostile/planner_under_test.h"
#include "tests/hostile/tally.h"

namespace dynapipe::testing::hostile {
namespace {

namespace fs = std::filesystem;

TEST_CASE("Malformed inputs to the planner and the CLI: no crash, no hang, nothing accepted", "[hostile][integration]") {
  const absl::Time start = absl::Now();
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const std::string scratch = FreshTempDir("hostile");
  std::error_code ec;
  fs::create_directories(scratch + "/specs", ec);
  auto root = MakeDataRoot(scratch, CorpusDir() + "/lengths");
  INFO(root.status().ToString());
  REQUIRE(root.ok());
  auto weights = MakeWeightsCorpus(root->root);
  INFO(weights.status().ToString());
  REQUIRE(weights.ok());
  auto ckpt = MakeCheckpointCorpus(scratch + "/ckpt");
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  const std::string fifo = scratch + "/abs-fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string token = absl::StrCat("hostile-", ::getpid(), "-", absl::ToUnixNanos(absl::Now()));
  PlannerUnderTest planner((*redis)->port(),
                           {"--data_root=" + root->root, "--planning_threads=1", "--log_file=" + scratch + "/planner.log"},
                           token);
  REQUIRE(planner.Start().ok());
  PlannerUnderTest permissive((*redis)->port(), {"--data_root=/", "--planning_threads=1", "--redis_prefix=permissive:"}, "");
  REQUIRE(permissive.Start().ok());
  const absl::Time ready = absl::Now();

  Tally t({{root->root, "$ROOT"}, {root->outside, "$OUTSIDE"}, {scratch, "$SCRATCH"}, {RunfilesRoot(), "$RUNFILES"},
           {planner.address(), "$PLANNER"}, {permissive.address(), "$PLANNER2"}});
  t.set_secret(token);
  const proto::JobSpec base = BaseJob(root->lengths);
  const std::string files = scratch + "/specs";
  t.set_verbose(std::getenv("HOSTILE_VERBOSE") != nullptr);
  std::vector<std::string> aborted;
  // HOSTILE_SECTIONS=name,name runs only those (by hand, while debugging one).
  const char* only = std::getenv("HOSTILE_SECTIONS");
  auto timed = [&](const char* what, const std::function<void()>& section) {
    if (only != nullptr && std::string(only).find(what) == std::string::npos) return;
    const absl::Time t0 = absl::Now();
    // A section that cannot set itself up (a failed REQUIRE) is reported, and
    // the others still run, so that the table always comes out.
    try {
      section();
    } catch (...) {
      aborted.push_back(what);
    }
    std::printf("hostile: %-14s %6.1f s (%d inputs so far)\n", what, absl::ToDoubleSeconds(absl::Now() - t0), t.inputs());
    std::fflush(stdout);
  };
  timed("job specs", [&] { FeedJobSpecs(planner, t, base, files); });
  timed("job paths", [&] { FeedJobPaths(planner, permissive, t, base, *root, fifo, files); });
  timed("spec files", [&] { FeedSpecFiles(planner, t, scratch); });
  timed("lengths", [&] { FeedLengthsFiles(planner, t, base, *root, scratch); });
  timed("datasets", [&] { FeedDatasets(planner, t, base, *root); });
  timed("weights", [&] { FeedWeights(planner, t, base, *weights); });
  timed("checkpoints", [&] { FeedCheckpoints(planner, t, *ckpt); });
  timed("stored plans", [&] { FeedStoredPlans(planner, t, (*redis)->port(), base); });
  timed("grpc wire", [&] { FeedGrpcWire(planner, t); });
  timed("grpc auth", [&] { FeedGrpcAuth(planner, t, base); });
  timed("grpc size", [&] { FeedGrpcSize(planner, t, base); });
  timed("http", [&] { FeedHttp(planner, t); });
  timed("cli flags", [&] { FeedCliFlags(planner, t, scratch, fifo, *ckpt); });

  const absl::Duration took = absl::Now() - start;
  const std::string table = absl::StrCat(
      t.Markdown(), "\n", t.inputs(), " malformed inputs: ", t.count(Outcome::kRefused), " refused, ",
      t.count(Outcome::kAccepted), " accepted, ", t.count(Outcome::kHang), " hung, ", t.count(Outcome::kCrash),
      " crashed; ", t.controls_accepted(), "/", t.controls(), " valid controls accepted; planner restarts: ",
      planner.restarts() + permissive.restarts(), "; run time ", absl::StrFormat("%.0f", absl::ToDoubleSeconds(took)),
      " s (", absl::StrFormat("%.1f", absl::ToDoubleSeconds(ready - start)), " s of set-up).\n",
      aborted.empty() ? "" : absl::StrCat("Sections that could not run: ", absl::StrJoin(aborted, ", "), ".\n"));
  std::printf("\n%s", table.c_str());
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  std::ofstream(std::string(outputs != nullptr ? outputs : TmpDir()) + "/hostile-inputs.md") << table;
  for (const std::string& f : t.Failures()) UNSCOPED_INFO(f);
  CHECK(t.count(Outcome::kAccepted) == 0);
  CHECK(t.count(Outcome::kHang) == 0);
  CHECK(t.count(Outcome::kCrash) == 0);
  CHECK(t.controls_accepted() == t.controls());
  CHECK(t.leaks() == 0);
  CHECK(t.inputs() >= 300);
  CHECK(aborted.empty());
}

}  // namespace
}  // namespace dynapipe::testing::hostile
