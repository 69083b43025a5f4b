// The bundle is relocatable: unpacked in a fresh folder, every binary finds
// each library it needs that the target machine does not provide inside the
// bundle, through $ORIGIN-relative RUNPATHs, and runs real work with an empty
// environment.

#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "src/testing/shell.h"
#include "src/testing/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using dynapipe::testing::Runfiles;
using Output = dynapipe::testing::ShellOutput;

Output Shell(const std::string& command) { return dynapipe::testing::RunShell(command); }

// What the target machine provides (deploy/make_bundle.sh's list).
bool TargetProvided(const std::string& soname) {
  for (const char* prefix : {"linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so",
                             "libresolv.so", "libutil.so", "libanl.so", "libstdc++.so", "libgcc_s.so", "libcuda",
                             "libcublas", "libnccl", "libcudnn", "libnvidia-", "libnvrtc", "libnvJitLink"}) {
    if (soname.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Unpacks the bundle into a fresh folder, moved away from where it was built.
std::string Unpack() {
  const std::string dir = dynapipe::testing::FreshTempDir("bundle");
  fs::create_directories(dir);
  const Output tar = Shell("tar -xzf '" + Runfiles() + "/deploy/dynapipe-bundle.tar.gz' -C '" + dir + "'");
  INFO(tar.text);
  REQUIRE(tar.rc == 0);
  return dir + "/dynapipe";
}

TEST_CASE("Every library a bundled binary needs resolves inside the bundle or is the target's own") {
  const std::string root = Unpack();
  const std::vector<std::string> binaries = {"dynapipe", "dynapipe-planner", "dynapipe-executor"};
  int bundled_resolved = 0;
  for (const std::string& bin : binaries) {
    const std::string path = root + "/bin/" + bin;
    REQUIRE(fs::exists(path));
    const Output rpath = Shell("readelf -d '" + path + "' | grep -E 'RUNPATH|RPATH'");
    INFO(bin << ": " << rpath.text);
    CHECK(rpath.text.find("[$ORIGIN/../lib") != std::string::npos);

    const Output ldd = Shell("env -i ldd '" + path + "'");
    INFO(ldd.text);
    REQUIRE(ldd.rc == 0);
    std::istringstream lines(ldd.text);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string soname, arrow, where;
      words >> soname >> arrow >> where;
      if (arrow != "=>") continue;
      INFO(bin << " needs " << soname << " from " << where);
      CHECK(where != "not");  // "not found"
      if (TargetProvided(soname)) continue;
      CHECK(where.rfind(root + "/bin/../lib/", 0) == 0);
      ++bundled_resolved;
    }
  }
  // gRPC, Protobuf, Abseil, hiredis, spdlog, fmt, Gloo, OpenBLAS, ...: the
  // bundle is only meaningful if it actually carries them.
  CHECK(bundled_resolved > 10);

  const Output manifest = Shell("cat '" + root + "/MANIFEST'");
  CHECK(manifest.text.find("needs from the target: glibc >= 2.") != std::string::npos);
  CHECK(manifest.text.find("libgrpc++") != std::string::npos);
}

TEST_CASE("The unpacked bundle plans real batches with an empty environment") {
  const std::string root = Unpack();
  const std::string model = Runfiles() + "/configs/models/gpt-tiny.pbtxt";
  const std::string lengths = Runfiles() + "/tests/data/flan-like-lengths.txt";
  const Output plan = Shell("cd / && env -i '" + root + "/bin/dynapipe' plan --lengths '" + lengths + "' --model '" +
                            model + "' --stages 2 --device cpu --global-batch-tokens 4096 --iters 2");
  INFO(plan.text);
  REQUIRE(plan.rc == 0);
  CHECK(plan.text.find("iteration") != std::string::npos);
  // A model by name: the bundle carries configs/ beside bin/.
  const Output named = Shell("cd / && env -i '" + root + "/bin/dynapipe' plan --lengths '" + lengths +
                             "' --model gpt-6.7b --stages 8 --global-batch-tokens 65536 --iters 1");
  INFO(named.text);
  CHECK(named.rc == 0);
  CHECK(std::filesystem::exists(root + "/configs/jobs/quickstart.pbtxt"));

  // The daemons start far enough to parse their flags (usage errors are
  // reported with a non-zero status, not a loader failure).
  for (const std::string daemon : {"dynapipe-planner", "dynapipe-executor"}) {
    const Output help = Shell("env -i '" + root + "/bin/" + daemon + "' --help");
    INFO(daemon << ": " << help.text);
    CHECK(help.rc == 0);
    CHECK(help.text.find("error while loading shared libraries") == std::string::npos);
    CHECK(help.text.find("--") != std::string::npos);
  }
}

TEST_CASE("dynapipe-env finds the CUDA libraries only when asked and passes the command through") {
  const std::string root = Unpack();
  const Output env = Shell("env -i PATH=/usr/bin:/bin '" + root + "/bin/dynapipe-env' sh -c 'echo ok:$LD_LIBRARY_PATH'");
  INFO(env.text);
  REQUIRE(env.rc == 0);
  CHECK(env.text.rfind("ok:", 0) == 0);
  const Output fail = Shell("env -i PATH=/usr/bin:/bin '" + root + "/bin/dynapipe-env' sh -c 'exit 3'");
  CHECK(fail.rc == 3);
  // The search ran once: its result is kept per host and CUDA_HOME, and a
  // kept directory that no longer exists sends it searching again.
  const Output cache = Shell("cat '" + root + "/bin/.dynapipe-env.'*");
  INFO(cache.text);
  REQUIRE(cache.rc == 0);
  CHECK(cache.text.rfind("/usr/local/cuda\n", 0) == 0);
  const Output again = Shell("env -i PATH=/usr/bin:/bin '" + root + "/bin/dynapipe-env' sh -c 'echo ok:$LD_LIBRARY_PATH'");
  CHECK(again.text == env.text);
  const std::string kept = "'" + root + "/bin/.dynapipe-env.'$(hostname 2>/dev/null || echo host)";
  REQUIRE(Shell("printf '/usr/local/cuda\\n/tmp\\n' > " + kept).rc == 0);
  CHECK(Shell("env -i PATH=/usr/bin:/bin '" + root + "/bin/dynapipe-env' sh -c 'echo ok:$LD_LIBRARY_PATH'").text ==
        "ok:/tmp\n");
  REQUIRE(Shell("printf '/usr/local/cuda\\n/nonexistent/lib\\n' > " + kept).rc == 0);
  const Output stale = Shell("env -i PATH=/usr/bin:/bin '" + root + "/bin/dynapipe-env' sh -c 'echo ok:$LD_LIBRARY_PATH'");
  CHECK(stale.text == env.text);
  const Output other = Shell("env -i PATH=/usr/bin:/bin CUDA_HOME=/nonexistent '" + root +
                             "/bin/dynapipe-env' sh -c 'echo ok:$LD_LIBRARY_PATH'");
  CHECK(other.text.find("/usr/local/cuda/lib64") == std::string::npos);
}

}  // namespace
