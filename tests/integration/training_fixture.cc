#include "tests/integration/training_fixture.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "src/checkpoint/checkpoint.h"
#include "src/data/synth.h"

namespace dynapipe::testing {

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

std::unique_ptr<ChildProcess> StartExecutor(const ExecutorProcessOptions& o) {
  std::vector<std::string> argv = o.prefix;
  argv.insert(argv.end(), {RunfilesRoot() + "/runtime/executor/dynapipe-executor", "--planner=" + o.planner,
                           "--data_root=/", absl::StrCat("--device=", o.device), "--node=" + o.node, "--http_port=-1",
                           absl::StrCat("--comm_timeout_s=", o.comm_timeout_s), "--log_level=warn",
                           "--log_file=" + (o.log_file.empty() ? absl::StrCat(TmpDir(), "/executor-", ::getpid(), "-",
                                                                              o.device, ".log")
                                                               : o.log_file)});
  argv.insert(argv.end(), o.extra.begin(), o.extra.end());
  return std::make_unique<ChildProcess>(argv,
                                        std::vector<std::pair<std::string, std::string>>{{"OPENBLAS_NUM_THREADS", "1"}});
}

std::unique_ptr<ChildProcess> StartExecutor(const std::string& planner, int device) {
  ExecutorProcessOptions o;
  o.planner = planner;
  o.device = device;
  return StartExecutor(o);
}

ProcessCluster StartProcessCluster(const std::vector<std::string>& planner_flags) {
  ProcessCluster c;
  auto redis = RedisServer::Start(absl::Seconds(10), /*persistent=*/true);
  REQUIRE(redis.ok());
  c.redis = std::move(*redis);
  auto planner = PlannerProcess::Start(c.redis->port(), planner_flags);
  REQUIRE(planner.ok());
  c.planner = std::move(*planner);
  c.address = c.planner->address();
  c.client = Client(c.address);
  for (int d = 0; d < 4; ++d) c.executors.push_back(StartExecutor(c.address, d));
  return c;
}

bool Stop(ChildProcess* executor, absl::Duration wait) {
  executor->Signal(SIGTERM);
  return executor->Exited(wait);
}

namespace {

// `count` samples of 4 + [0, max_input) input and 1 + [0, 6) target tokens,
// once per directory name.
std::string SynthDataset(const std::string& name, int count, int max_input) {
  const std::string dir = TmpDir() + "/" + name;
  if (std::filesystem::exists(dir + "/dataset.pbtxt")) return dir;
  data::SynthOptions o;
  o.alphabet = 8;
  std::mt19937 rng(3);
  std::vector<data::RawLength> lengths;
  for (int i = 0; i < count; ++i) {
    lengths.push_back({4 + static_cast<int64_t>(rng() % max_input), 1 + static_cast<int64_t>(rng() % 6)});
  }
  auto w = data::DatasetWriter::Create(dir, data::SynthInfo(o));
  REQUIRE(w.ok());
  REQUIRE(data::Synthesize(lengths, o, w->get()).ok());
  REQUIRE((*w)->Finish().ok());
  return dir;
}

}  // namespace

std::string Dataset() { return SynthDataset("executor_ds", 200, 40); }

std::string WideDataset() { return SynthDataset("executor_wide_ds", 600, 118); }

proto::JobSpec TrainJob(int iterations, const std::string& ckpt, int interval) {
  proto::JobSpec s;
  s.set_name("train-itest");
  auto* m = s.mutable_model();
  m->set_kind(proto::ModelKind::gpt);
  m->set_num_layers(4);
  m->set_hidden(32);
  m->set_heads(4);
  m->set_ffn(64);
  m->set_vocab(16);
  m->set_max_positions(64);
  m->set_dtype(proto::DType::fp32);
  m->set_tie_embeddings(true);
  s.mutable_parallelism()->set_pp(2);
  s.mutable_parallelism()->set_dp(2);
  s.mutable_dataset()->set_path(Dataset());
  s.mutable_dataset()->set_format(proto::DatasetSpec::indexed);
  s.mutable_batching()->set_method(proto::BatchingSpec::dynamic);
  s.mutable_batching()->set_global_batch_tokens(600);
  s.mutable_batching()->set_max_seq_len(64);
  s.mutable_schedule()->set_recompute(proto::RecomputeLevel::none);
  s.mutable_optimizer()->set_lr(3e-3);
  s.mutable_optimizer()->set_grad_clip(1.0);
  s.mutable_optimizer()->mutable_lr_schedule()->set_kind(proto::LrSchedule::cosine);
  s.mutable_optimizer()->mutable_lr_schedule()->set_warmup_iters(2);
  s.mutable_optimizer()->mutable_lr_schedule()->set_decay_iters(200);  // independent of `iterations`
  s.set_iterations(iterations);
  s.set_seed(5);
  s.mutable_checkpoint()->set_dir(ckpt);
  s.mutable_checkpoint()->set_interval(interval);
  auto* c = s.mutable_cluster();
  c->set_name("cpu");
  c->set_num_nodes(1);
  c->set_devices_per_node(4);
  c->mutable_device()->set_peak_tflops(0.05);
  c->mutable_device()->set_memory_bandwidth_gbps(10);
  c->mutable_device()->set_memory_mb(4096);
  c->set_intra_node_bandwidth_gbps(20);
  c->set_inter_node_bandwidth_gbps(20);
  return s;
}

proto::JobSpec T5TrainJob(int iterations, const std::string& ckpt, int interval) {
  proto::JobSpec s = TrainJob(iterations, ckpt, interval);
  s.set_name("t5-itest");
  s.mutable_model()->set_kind(proto::ModelKind::t5);
  s.mutable_model()->set_num_layers(2);
  s.mutable_model()->set_num_decoder_layers(2);
  return s;
}

proto::JobStatus WaitEnded(rpc::PlannerClient* client, const std::string& job, absl::Duration limit) {
  proto::JobStatus last;
  Eventually(
      [&] {
        auto st = client->Get(job);
        if (!st.ok()) return false;
        last = *st;
        return last.state() == proto::JobState::succeeded || last.state() == proto::JobState::failed ||
               last.state() == proto::JobState::cancelled;
      },
      limit);
  return last;
}

std::vector<float> Params(const std::string& dir, int64_t iteration, int rank) {
  auto shard = checkpoint::ReadShard(dir, iteration, rank);
  std::vector<float> out;
  if (!shard.ok()) return out;
  for (const auto& t : shard->params) out.insert(out.end(), t.data.begin(), t.data.end());
  for (const auto& t : shard->adam_m) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

}  // namespace dynapipe::testing
