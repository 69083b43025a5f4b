#include "runtime/executor/checkpointer.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

#include "runtime/backend/backend.h"
#include "runtime/comm/kv_store.h"
#include "src/common/proto_io.h"
#include "src/testing/temp_dir.h"
#include "src/spec/normalized_for_test.h"

namespace dynapipe::runtime::executor {
namespace {

proto::JobSpec Spec() {
  proto::JobSpec spec;
  REQUIRE(ParseTextProto(R"pb(
    name: "ckpt"
    model { name: "t" kind: gpt num_layers: 2 hidden: 32 heads: 4 ffn: 64 vocab: 40 max_positions: 32
            tie_embeddings: true }
    parallelism { pp: 1 dp: 1 }
    dataset { path: "unused" }  # no plans run
    cluster { device { name: "cpu" peak_tflops: 1 memory_bandwidth_gbps: 10 memory_mb: 4096 } }
    iterations: 4
    seed: 9
  )pb", "spec", &spec).ok());
  return spec;
}

// One rank's worker on the CPU backend (no plans run: the test sets its state).
struct Rank {
  std::unique_ptr<Backend> backend;
  comm::MemoryKeyValueStore kv;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<Worker> worker;
  Rank() {
    backend = *CreateBackend({.kind = proto::Backend::cpu});
    comm = *backend->Connect({.rank = 0, .size = 1, .job_prefix = "t/"}, &kv);
    const int32_t layers[] = {0, 1};
    worker = *Worker::Create(spec::NormalizedForTest(Spec()), layers, 0, 1, 1, comm.get(), nullptr, backend.get(), {});
  }
};

checkpoint::ShardInfo Info() {
  checkpoint::ShardInfo info;
  info.rank = 0;
  info.world = 1;
  info.job_fingerprint = checkpoint::JobFingerprint(spec::NormalizedForTest(Spec()));
  return info;
}

TEST_CASE("a checkpoint written in the background restores every parameter and moment bit for bit", "[executor]") {
  const std::string dir = testing::FreshTempDir("ckpt");
  Rank a;
  model::Stage& stage = *a.worker->chunks()[0];
  model::StageState state;
  REQUIRE(stage.ExportState(&state).ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto* v : {&state.params, &state.adam_m, &state.adam_v}) {
    for (float& x : *v) x = normal(rng);
  }
  REQUIRE(stage.ImportState(state).ok());
  a.worker->set_optimizer_step(17);
  {
    Checkpointer ckpt(dir, Info());
    REQUIRE(ckpt.Begin(5, *a.worker).ok());
    // Training may change the state meanwhile: the shard holds the snapshot.
    model::StageState changed = state;
    changed.params[0] += 1;
    REQUIRE(stage.ImportState(changed).ok());
    REQUIRE(ckpt.Wait().ok());
    CHECK(std::filesystem::exists(checkpoint::ShardPath(dir, 5, 0)));
    CHECK(ckpt.Wait().ok());  // nothing in flight
  }
  Rank b;
  Checkpointer restore(dir, Info());
  REQUIRE(restore.Restore(5, *b.worker).ok());
  model::StageState back;
  REQUIRE(b.worker->chunks()[0]->ExportState(&back).ok());
  CHECK(back.params == state.params);
  CHECK(back.adam_m == state.adam_m);
  CHECK(back.adam_v == state.adam_v);
  CHECK(b.worker->optimizer_step() == 17);
  CHECK(restore.Restore(6, *b.worker).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a shard of another job layout, or a failed write, is an error the caller sees", "[executor]") {
  const std::string dir = testing::FreshTempDir("ckpt_bad");
  Rank a;
  checkpoint::ShardInfo other = Info();
  other.job_fingerprint += 1;
  {
    Checkpointer ckpt(dir, other);
    REQUIRE(ckpt.Begin(0, *a.worker).ok());
    REQUIRE(ckpt.Wait().ok());
  }
  Checkpointer mine(dir, Info());
  CHECK(mine.Restore(0, *a.worker).code() == absl::StatusCode::kFailedPrecondition);

  // The checkpoint directory is a file: the write fails, and Wait says so.
  const std::string parent = testing::FreshTempDir("ckpt_file");
  std::filesystem::create_directories(parent);
  const std::string file = parent + "/not-a-dir";
  std::ofstream(file) << "x";
  REQUIRE(std::filesystem::is_regular_file(file));
  Checkpointer broken(file, Info());
  REQUIRE(broken.Begin(0, *a.worker).ok());
  CHECK_FALSE(broken.Wait().ok());
}

}  // namespace
}  // namespace dynapipe::runtime::executor

// (Uses this file's one-rank worker.) A plan is input too: its buffer-slot
// count is bounded before the worker allocates anything for it.
namespace dynapipe::runtime::executor {
namespace {
TEST_CASE("a plan asking for 2^31-1 buffer slots is refused without allocating", "[executor]") {
  Rank a;
  proto::ExecutionPlan plan;
  plan.set_rank(0);
  plan.set_global_loss_tokens(1);
  plan.set_num_buffer_slots(2147483647);
  const auto r = a.worker->RunIteration(plan);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(r.status().message()), Catch::Matchers::Contains("2147483647 buffer slots"));
}
}  // namespace
}  // namespace dynapipe::runtime::executor
