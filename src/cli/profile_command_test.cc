#include "src/cli/profile_command.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "proto/cost_profile.pb.h"
#include "src/common/proto_io.h"

namespace dynapipe::cli {
namespace {

struct Run {
  int rc;
  std::string out, err;
};

Run Profile(std::vector<std::string> args, const ProfileBackends& backends = CpuProfileBackends()) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir != nullptr) std::filesystem::current_path(std::string(srcdir) + "/dynapipe");
  std::ostringstream out, err;
  const int rc = RunProfileCommand(args, out, err, backends);
  return {rc, out.str(), err.str()};
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + std::to_string(::getpid()) + "_" + name;
}

TEST_CASE("dynapipe profile measures the job's model on the CPU and names the device") {
  const std::string path = TempPath("profile.json");
  const Run r = Profile({"--job", "configs/jobs/quickstart.pbtxt", "--out", path, "--seq", "8,16", "--mbs", "1,2",
                         "--repetitions", "1"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("(cpu)") != std::string::npos);
  proto::CostProfile profile;
  REQUIRE(LoadProtoFile(path, &profile).ok());
  CHECK(profile.device() == "cpu");
  REQUIRE(profile.layers_size() == 3);
  for (const auto& layer : profile.layers()) {
    REQUIRE(layer.points_size() == 4);
    for (const auto& p : layer.points()) {
      CHECK(p.fw_ms() > 0);
      CHECK(p.bw_ms() > 0);
    }
  }
}

TEST_CASE("dynapipe profile --device picks among the program's backends and names the missing one") {
  const Run cuda = Profile({"--job", "configs/jobs/quickstart.pbtxt", "--out", TempPath("x.json"), "--device", "cuda"});
  CHECK(cuda.rc == 2);
  CHECK(cuda.err.find("dynapipe-gpu-profile") != std::string::npos);
  const Run tpu = Profile({"--job", "configs/jobs/quickstart.pbtxt", "--out", TempPath("x.json"), "--device", "tpu"});
  CHECK(tpu.rc == 2);
  CHECK(tpu.err.find("'tpu'") != std::string::npos);

  // A program with another default device uses it without --device.
  ProfileBackends fake;
  fake.default_device = "fake";
  bool called = false;
  fake.by_device["fake"] = [&](const runtime::model::GptConfig&, const runtime::model::ProfileOptions& o) {
    called = true;
    proto::CostProfile p;
    p.set_device("fake-gpu");
    CHECK(o.repetitions == 2);
    return absl::StatusOr<proto::CostProfile>(p);
  };
  const std::string path = TempPath("fake.json");
  const Run r = Profile({"--job", "configs/jobs/quickstart.pbtxt", "--out", path, "--repetitions", "2", "--seq", "8",
                         "--mbs", "1"},
                        fake);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(called);
  CHECK(r.out.find("(fake-gpu)") != std::string::npos);
}

}  // namespace
}  // namespace dynapipe::cli
