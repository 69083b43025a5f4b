#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <random>

#include "runtime/data/synth.h"
#include "runtime/executor/local_run.h"
#include "absl/strings/str_cat.h"
#include "src/common/proto_io.h"

namespace dynapipe::runtime::executor {
namespace {

// A dataset of 96 synthetic samples, 10..70 tokens each, under TEST_TMPDIR.
std::string MakeDataset() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/worker_ds_" + std::to_string(::getpid());
  if (std::filesystem::exists(dir + "/dataset.pbtxt")) return dir;
  data::SynthOptions o;
  o.alphabet = 24;
  std::mt19937 rng(11);
  std::vector<planner::RawLength> lengths;
  for (int i = 0; i < 96; ++i) lengths.push_back({6 + static_cast<int64_t>(rng() % 56), 2 + static_cast<int64_t>(rng() % 10)});
  auto w = data::DatasetWriter::Create(dir, data::SynthInfo(o));
  REQUIRE(w.ok());
  REQUIRE(data::Synthesize(lengths, o, w->get()).ok());
  REQUIRE((*w)->Finish().ok());
  return dir;
}

proto::JobSpec Spec(const std::string& dataset, int pp, int dp, const char* method = "dynamic") {
  proto::JobSpec spec;
  const std::string text = absl::StrCat(R"pb(
    name: "worker-test"
    model { name: "t" kind: gpt num_layers: 4 hidden: 32 heads: 4 ffn: 64 vocab: 32 max_positions: 80
            dtype: fp32 tie_embeddings: true }
    dataset { path: ")pb", dataset, R"pb(" format: indexed }
    batching { method: )pb", method, R"pb( global_batch_tokens: 900 max_seq_len: 80 round_multiple: 8
               micro_batch_size: 4 }
    schedule { policy: auto recompute: none }
    optimizer { lr: 3e-3 grad_clip: 1.0 lr_schedule { kind: cosine warmup_iters: 2 } }
    iterations: 5
    seed: 3
    cluster { name: "cpu" num_nodes: 1 devices_per_node: 4
              device { name: "cpu" peak_tflops: 0.05 memory_bandwidth_gbps: 10 memory_mb: 4096 }
              intra_node_bandwidth_gbps: 20 inter_node_bandwidth_gbps: 20 }
    parallelism { pp: )pb", pp, " dp: ", dp, " }");
  REQUIRE(ParseTextProto(text, "spec", &spec).ok());
  return spec;
}

std::vector<double> Losses(const LocalRunResult& r) {
  std::vector<double> out;
  for (const IterationResult& it : r.per_rank[0]) out.push_back(it.loss);
  return out;
}

TEST_CASE("pipeline equivalence: pp=1, 2, 4 and 2x2 give the same losses for 5 iterations", "[executor]") {
  const std::string ds = MakeDataset();
  auto base = RunLocal(Spec(ds, 1, 1), "/", 5);
  REQUIRE(base.ok());
  const std::vector<double> want = Losses(*base);
  REQUIRE(want.size() == 5);
  CHECK(want[0] > 2.0);        // about ln(32) at initialisation
  CHECK(want[4] < want[0]);    // and it learns
  for (auto [pp, dp] : {std::pair{2, 1}, {4, 1}, {2, 2}}) {
    INFO("pp=" << pp << " dp=" << dp);
    auto run = RunLocal(Spec(ds, pp, dp), "/", 5);
    REQUIRE(run.ok());
    const int world = pp * dp;
    for (int r = 0; r < world; ++r) {
      REQUIRE(run->per_rank[r].size() == 5);
      for (int i = 0; i < 5; ++i) {
        INFO("rank " << r << " iteration " << i);
        // Every rank learns the same global loss.
        CHECK(run->per_rank[r][i].loss == run->per_rank[0][i].loss);
        CHECK(std::abs(run->per_rank[r][i].loss - want[i]) <= 1e-4 * want[i]);
        // The pool reserves at least what was requested; its slack is a share.
        const auto& res = run->per_rank[r][i];
        CHECK(res.peak_reserved_mb >= res.peak_memory_mb);
        CHECK(res.memory_fragmentation >= 0.0);
        CHECK(res.memory_fragmentation < 1.0);
      }
    }
    if (dp > 1) {
      // Data-parallel replicas stay bit-identical.
      for (int r = 0; r < pp; ++r) CHECK(run->final_params[r] == run->final_params[r + pp]);
    }
  }
}

TEST_CASE("dynamic, packing and padding batches train to the same losses", "[executor]") {
  const std::string ds = MakeDataset();
  auto dynamic = RunLocal(Spec(ds, 2, 1, "dynamic"), "/", 3);
  auto packing = RunLocal(Spec(ds, 2, 1, "packing"), "/", 3);
  auto padding = RunLocal(Spec(ds, 2, 1, "padding"), "/", 3);
  REQUIRE((dynamic.ok() && packing.ok() && padding.ok()));
  for (int i = 0; i < 3; ++i) {
    INFO("iteration " << i);
    CHECK(std::abs(Losses(*packing)[i] - Losses(*dynamic)[i]) <= 1e-4 * Losses(*dynamic)[i]);
    CHECK(std::abs(Losses(*padding)[i] - Losses(*dynamic)[i]) <= 1e-4 * Losses(*dynamic)[i]);
  }
  // Same real tokens, whatever the batching.
  CHECK(packing->per_rank[0][0].tokens == dynamic->per_rank[0][0].tokens);
}

}  // namespace
}  // namespace dynapipe::runtime::executor
