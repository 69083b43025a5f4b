#include "cli/profile_command.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "proto/cost_profile.pb.h"
#include "runtime/executor/test_dataset.h"
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
                         "--repetitions", "1", "--iterations", "0"});
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
                         "--mbs", "1", "--iterations", "0"},
                        fake);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(called);
  CHECK(r.out.find("(fake-gpu)") != std::string::npos);
}

TEST_CASE("dynapipe profile measures the terms layers leave out") {
  // The job trains on a small synthetic dataset under pp 2 x dp 1.
  const std::string dataset = runtime::executor::testing::WorkerTestDataset("profile_ds");
  const std::string job = TempPath("job.pbtxt");
  std::ofstream(job) << "name: \"profile-terms\"\n"
                        "model { kind: gpt num_layers: 2 hidden: 32 heads: 4 ffn: 64 vocab: 32 max_positions: 80\n"
                        "        dtype: fp32 tie_embeddings: true }\n"
                        "dataset { path: \""
                     << dataset
                     << "\" format: indexed }\n"
                        "batching { method: dynamic global_batch_tokens: 900 max_seq_len: 80 round_multiple: 8 }\n"
                        "schedule { recompute: none }\n"
                        "iterations: 6\n"
                        "parallelism { pp: 2 dp: 1 }\n"
                        "cluster { devices_per_node: 2 device { name: \"cpu\" peak_tflops: 0.05 "
                        "memory_bandwidth_gbps: 10 memory_mb: 4096 } }\n";
  const std::string path = TempPath("terms.json");
  const Run r = Profile({"--job", job, "--out", path, "--seq", "8,16,32,64,80", "--repetitions", "1", "--iterations", "6", "--data_root", "/"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("measured under pp 2 x dp 1") != std::string::npos);
  proto::CostProfile profile;
  REQUIRE(LoadProtoFile(path, &profile).ok());
  REQUIRE(profile.has_measured());
  CHECK(profile.measured().pp() == 2);
  CHECK(profile.measured().iterations() == 6);
  // Dispatch and hand-off cost something on every machine; a pipeline has transfers.
  CHECK(profile.measured().fw().micro_batch_ms() + profile.measured().dispatch_fw_ms() > 0);
  CHECK(profile.measured().has_transfer_latency_ms());
  CHECK(profile.measured().iteration_ms() > 0);
}

}  // namespace
}  // namespace dynapipe::cli
