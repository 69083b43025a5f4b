// The CPU kernels against the ones before their rewrite for speed (issue 16:
// SIMD GELU, LayerNorm, exp; attention on BLAS blocks): 50 iterations of a
// small job per case must give every loss and the final parameters' norm
// within 1e-5 relative of testdata/kernel_losses.txt, which the scalar
// kernels of commit bb3e45e wrote (DYNAPIPE_WRITE_KERNEL_GOLDEN=PATH makes
// this test write the file instead, from whatever kernels it is built with).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cli/local_run.h"
#include "runtime/executor/test_dataset.h"
#include "src/common/proto_io.h"
#include "src/testing/shell.h"

namespace dynapipe::runtime::executor {
namespace {

constexpr int kIterations = 50;

struct Case {
  const char* name;
  const char* method;
  const char* attention;
  const char* recompute;
  int pp, dp;
};

// Both attention kernels, every recomputation level and a pipeline with data
// parallelism: each exercises a different path through the rewritten kernels.
const Case kCases[] = {
    {"dynamic-varlen-1x1", "dynamic", "varlen", "none", 1, 1},
    {"dynamic-varlen-2x2", "dynamic", "varlen", "none", 2, 2},
    {"packing-materialized-1x1", "packing", "materialized", "none", 1, 1},
    {"padding-varlen-1x1", "padding", "varlen", "selective", 1, 1},
    {"dynamic-materialized-2x1", "dynamic", "materialized", "full", 2, 1},
};

proto::JobSpec Spec(const std::string& dataset, const Case& c) {
  proto::JobSpec spec;
  const std::string text = absl::StrCat(R"pb(
    name: "kernel-regression"
    model { name: "t" kind: gpt num_layers: 3 hidden: 32 heads: 4 ffn: 96 vocab: 32 max_positions: 80
            dtype: fp32 tie_embeddings: true attention: )pb", c.attention, R"pb( }
    dataset { path: ")pb", dataset, R"pb(" format: indexed }
    batching { method: )pb", c.method, R"pb( global_batch_tokens: 900 max_seq_len: 80 round_multiple: 8 }
    schedule { policy: auto recompute: )pb", c.recompute, R"pb( }
    optimizer { lr: 3e-3 grad_clip: 1.0 weight_decay: 0.1 lr_schedule { kind: cosine warmup_iters: 5 } }
    iterations: 50
    seed: 7
    cluster { name: "cpu" num_nodes: 1 devices_per_node: 4
              device { name: "cpu" peak_tflops: 0.05 memory_bandwidth_gbps: 10 memory_mb: 4096 }
              intra_node_bandwidth_gbps: 20 inter_node_bandwidth_gbps: 20 }
    parallelism { pp: )pb", c.pp, " dp: ", c.dp, " }");
  REQUIRE(ParseTextProto(text, "spec", &spec).ok());
  return spec;
}

struct Outcome {
  std::vector<double> losses;
  double param_norm = 0;
};

Outcome Run(const std::string& dataset, const Case& c) {
  auto run = cli::RunLocal(Spec(dataset, c), "/", kIterations);
  REQUIRE(run.ok());
  Outcome o;
  // The loss is the last stage's: rank pp - 1 (ranks go stage-major within a data-parallel group).
  for (const IterationResult& it : run->per_rank[c.pp - 1]) o.losses.push_back(it.loss);
  double sq = 0;
  for (const auto& rank : run->final_params) {
    for (float x : rank) sq += static_cast<double>(x) * x;
  }
  o.param_norm = std::sqrt(sq);
  return o;
}

// Format: one line per case: name, parameter norm, then the losses, all %a.
std::map<std::string, Outcome> ReadGolden(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::map<std::string, Outcome> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string name, norm;
    words >> name >> norm;
    Outcome& o = out[name];
    o.param_norm = std::strtod(norm.c_str(), nullptr);
    for (std::string w; words >> w;) o.losses.push_back(std::strtod(w.c_str(), nullptr));
  }
  return out;
}

double Rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

TEST_CASE("rewritten CPU kernels stay within 1e-5 of the scalar ones", "[executor]") {
  const std::string ds = testing::WorkerTestDataset("kernel_ds");
  if (const char* out = std::getenv("DYNAPIPE_WRITE_KERNEL_GOLDEN"); out != nullptr) {
    std::FILE* f = std::fopen(out, "w");
    REQUIRE(f != nullptr);
    std::fprintf(f, "# runtime/executor:kernel_regression_test: case, final parameter norm, %d losses (%%a)\n",
                 kIterations);
    for (const Case& c : kCases) {
      const Outcome o = Run(ds, c);
      std::fprintf(f, "%s %a", c.name, o.param_norm);
      for (double l : o.losses) std::fprintf(f, " %a", l);
      std::fprintf(f, "\n");
    }
    std::fclose(f);
    return;
  }
  const auto golden = ReadGolden(dynapipe::testing::Runfiles() + "/runtime/executor/testdata/kernel_losses.txt");
  double worst = 0;
  for (const Case& c : kCases) {
    INFO(c.name);
    REQUIRE(golden.contains(c.name));
    const Outcome& want = golden.at(c.name);
    const Outcome got = Run(ds, c);
    REQUIRE(got.losses.size() == want.losses.size());
    REQUIRE(got.losses.size() == static_cast<size_t>(kIterations));
    for (int i = 0; i < kIterations; ++i) {
      INFO("iteration " << i << ": " << got.losses[i] << " vs " << want.losses[i]);
      CHECK(Rel(got.losses[i], want.losses[i]) <= 1e-5);
      worst = std::max(worst, Rel(got.losses[i], want.losses[i]));
    }
    CHECK(Rel(got.param_norm, want.param_norm) <= 1e-5);
    // Not vacuous: the job learns.
    CHECK(got.losses.back() < got.losses.front() - 0.2);
  }
  std::printf("kernel regression: worst loss difference %.3g relative over %d iterations x %zu cases\n", worst,
              kIterations, std::size(kCases));
}

}  // namespace
}  // namespace dynapipe::runtime::executor
