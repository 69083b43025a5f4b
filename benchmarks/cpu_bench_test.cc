// The CPU-vs-PyTorch benchmark's code paths on a tiny job: dump -> file ->
// our training (which must reproduce the executor's own losses exactly) ->
// op timings -> PyTorch's training on the same dump (losses within 1e-4;
// skipped with a message where /usr/bin/python3 has no torch).
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "benchmarks/batch_dump.h"
#include "benchmarks/op_timings.h"
#include "benchmarks/plan_dump.h"
#include "benchmarks/train_on_dump.h"
#include "runtime/backend/backend.h"
#include "src/data/synth.h"
#include "cli/local_run.h"
#include "src/common/proto_io.h"
#include "src/testing/shell.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::benchmarks {
namespace {

using runtime::model::AttentionKernel;

// 160 synthetic samples of 6..60 tokens; vocabulary 16 (alphabet 8).
std::string MakeDataset(const std::string& root) {
  data::SynthOptions o;
  o.alphabet = 8;
  std::mt19937 rng(5);
  std::vector<data::RawLength> lengths;
  for (int i = 0; i < 160; ++i) {
    lengths.push_back({4 + static_cast<int64_t>(rng() % 50), 2 + static_cast<int64_t>(rng() % 8)});
  }
  const std::string dir = root + "/data";
  auto w = data::DatasetWriter::Create(dir, data::SynthInfo(o));
  REQUIRE(w.ok());
  REQUIRE(data::Synthesize(lengths, o, w->get()).ok());
  REQUIRE((*w)->Finish().ok());
  return "data";
}

proto::JobSpec Spec(const std::string& dataset, const std::string& method) {
  proto::JobSpec spec;
  const std::string text = absl::StrCat(R"pb(
    name: "bench-test"
    model { name: "t" kind: gpt num_layers: 2 hidden: 32 heads: 4 ffn: 64 vocab: 16 max_positions: 64
            dtype: fp32 tie_embeddings: true }
    dataset { path: ")pb", dataset, R"pb(" format: indexed }
    batching { method: )pb", method, R"pb( global_batch_tokens: 600 max_seq_len: 64 round_multiple: 8 }
    schedule { policy: auto recompute: none }
    optimizer { lr: 3e-3 grad_clip: 1.0 weight_decay: 0.1 lr_schedule { kind: cosine warmup_iters: 2 } }
    iterations: 4
    seed: 7
    cluster { name: "cpu" num_nodes: 1 devices_per_node: 1
              device { name: "cpu" peak_tflops: 0.05 memory_bandwidth_gbps: 10 memory_mb: 4096 }
              intra_node_bandwidth_gbps: 20 inter_node_bandwidth_gbps: 20 }
    parallelism { pp: 1 dp: 1 })pb");
  REQUIRE(ParseTextProto(text, "spec", &spec).ok());
  return spec;
}

// The "loss" of every {"kind": "iteration"} line.
std::vector<double> JsonLosses(const std::string& text) {
  std::vector<double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"iteration\"") == std::string::npos || line.find("\"kind\"") == std::string::npos) continue;
    const size_t at = line.find("\"loss\": ");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 8)));
  }
  return out;
}

// Whether /usr/bin/python3 has torch (Debian's python3-torch); the PyTorch
// sides are skipped with a warning otherwise.
bool TorchAvailable() { return testing::RunShell("/usr/bin/python3 -c 'import torch' 2>/dev/null").rc == 0; }

// torch_gpt.py on a dump (one thread, no op timings, `flags` added).
testing::ShellOutput TorchReplay(const std::string& prefix, const std::string& flags) {
  return testing::RunShell(absl::StrCat("OMP_NUM_THREADS=1 /usr/bin/python3 ", testing::Runfiles(),
                                        "/benchmarks/torch_gpt.py --dump ", prefix, " --no-ops", flags));
}

TEST_CASE("Model FLOPs count weights per token and causal pairs per sample", "[benchmarks]") {
  runtime::model::GptConfig c;
  c.num_layers = 2;
  c.hidden = 4;
  c.ffn = 8;
  c.vocab = 10;
  // Row 0: samples of 3 and 2 tokens, then padding; row 1: one of 4 tokens.
  runtime::model::TokenBatch b;
  b.rows = 2;
  b.seq = 6;
  b.segments = {0, 0, 0, 1, 1, -1, 0, 0, 0, 0, -1, -1};
  b.real_tokens = 9;
  b.loss_tokens = 6;
  const double pairs = 6 + 3 + 10;           // 3*4/2 + 2*3/2 + 4*5/2
  const double weights = 4 * 16 + 2 * 4 * 8;  // per layer
  const double forward = 2 * 2 * weights * 9 + 2 * 4 * 10 * 6 + 4 * 4 * 2 * pairs;
  CHECK(ModelFlops(c, b) == 3 * forward);
}

TEST_CASE("dump -> our training reproduces the executor; ops time; PyTorch agrees", "[benchmarks]") {
  const std::string root = testing::FreshTempDir("cpu_bench");
  const std::string dataset = MakeDataset(root);
  constexpr int kIterations = 4;
  for (const char* method : {"dynamic", "packing", "padding"}) {
    INFO("method " << method);
    const proto::JobSpec spec = Spec(dataset, method);
    auto made = DumpPlans(spec, root, kIterations);
    REQUIRE(made.ok());
    const std::string prefix = absl::StrCat(root, "/", method);
    REQUIRE(WriteBatchDump(*made, prefix).ok());
    auto dump = ReadBatchDump(prefix);
    REQUIRE(dump.ok());
    REQUIRE(dump->iterations.size() == kIterations);
    for (int i = 0; i < kIterations; ++i) {
      const IterationDump &a = made->iterations[i], &b = dump->iterations[i];
      CHECK(a.loss_scale == b.loss_scale);
      CHECK(a.lr == b.lr);
      CHECK(a.predicted_ms > 0);
      CHECK(std::abs(b.predicted_ms - a.predicted_ms) <= 1e-5 * a.predicted_ms);
      CHECK(a.steps.size() == 2 * a.batches.size());
      REQUIRE(a.batches.size() == b.batches.size());
      for (size_t j = 0; j < a.batches.size(); ++j) {
        CHECK(a.batches[j].tokens == b.batches[j].tokens);
        CHECK(a.batches[j].segments == b.batches[j].segments);
        CHECK(a.batches[j].targets == b.batches[j].targets);
        CHECK(a.batches[j].positions == b.batches[j].positions);
      }
    }

    // The executor (worker + planner, one rank, the job's varlen kernel) and
    // our replay must agree bit for bit; the materialized kernel computes the
    // same function (to rounding).
    auto run = cli::RunLocal(spec, root, kIterations);
    REQUIRE(run.ok());
    auto backend = runtime::CreateBackend({});
    REQUIRE(backend.ok());
    for (const AttentionKernel kernel : {AttentionKernel::kVarlen, AttentionKernel::kMaterialized}) {
      INFO((kernel == AttentionKernel::kVarlen ? "varlen" : "materialized"));
      auto trained = TrainOnDump(*dump, kernel, **backend);
      REQUIRE(trained.ok());
      REQUIRE(trained->size() == kIterations);
      for (int i = 0; i < kIterations; ++i) {
        const double want = run->per_rank[0][i].loss, got = (*trained)[i].loss;
        if (kernel == AttentionKernel::kVarlen) {
          CHECK(got == want);
        } else {
          CHECK(std::abs(got - want) <= 1e-5 * std::abs(want));
        }
        CHECK((*trained)[i].real_tokens == run->per_rank[0][i].tokens);
      }
    }

    OpTimingOptions o;
    o.iterations = {0, 1};
    o.reps = 1;
    auto ops = TimeOps(*dump, o);
    REQUIRE(ops.ok());
    CHECK(ops->size() == 21);  // 10 ops x fwd/bwd + AdamW
    for (const OpTiming& t : *ops) {
      INFO(t.op);
      CHECK(t.seconds >= 0);
      CHECK(std::isfinite(t.seconds));
    }

    if (!TorchAvailable()) {
      WARN("skipping the PyTorch side: /usr/bin/python3 cannot import torch (Debian: apt install python3-torch)");
      continue;
    }
    const testing::ShellOutput torch = TorchReplay(prefix, "");
    INFO(torch.text);
    REQUIRE(torch.rc == 0);
    const std::vector<double> losses = JsonLosses(torch.text);
    REQUIRE(losses.size() == kIterations);
    for (int i = 0; i < kIterations; ++i) CHECK(std::abs(losses[i] - run->per_rank[0][i].loss) < 1e-4);
    // The GPU reference's mixed precision, on the CPU: bf16 autocast stays near fp32.
    const testing::ShellOutput bf16 = TorchReplay(prefix, " --precision bf16");
    INFO(bf16.text);
    REQUIRE(bf16.rc == 0);
    const std::vector<double> bf16_losses = JsonLosses(bf16.text);
    REQUIRE(bf16_losses.size() == kIterations);
    for (int i = 0; i < kIterations; ++i) CHECK(std::abs(bf16_losses[i] - losses[i]) < 2e-2 * losses[i]);
  }
}

TEST_CASE("The GPU reference's varlen attention lays tokens out as the masked reference does", "[benchmarks]") {
  if (!TorchAvailable()) {
    WARN("skipping: /usr/bin/python3 cannot import torch (Debian: apt install python3-torch)");
    return;
  }
  const testing::ShellOutput out = testing::RunShell(
      absl::StrCat("/usr/bin/python3 ", testing::Runfiles(), "/benchmarks/torch_gpt.py --self-test"));
  INFO(out.text);
  CHECK(out.rc == 0);
}

TEST_CASE("The GPU benchmark's driver runs end to end (both sides on the CPU)", "[benchmarks]") {
  if (!TorchAvailable()) {
    WARN("skipping: /usr/bin/python3 cannot import torch (Debian: apt install python3-torch)");
    return;
  }
  // The bundle's layout: bin/ with the three programs, a small model.
  const std::string root = testing::FreshTempDir("gpu_vs_torch");
  const std::string rf = testing::Runfiles();
  REQUIRE(testing::RunShell(absl::StrCat("mkdir -p ", root, "/bin && ln -s ", rf, "/cli/dynapipe ", rf,
                                         "/benchmarks/dump_batches ", rf, "/benchmarks/cpu_bench ", root, "/bin/ && ",
                                         "sed -e 's/num_layers: 24/num_layers: 2/; s/hidden: 1024/hidden: 32/; "
                                         "s/heads: 16/heads: 2/; s/ffn: 4096/ffn: 64/; s/vocab: 50304/vocab: 64/; "
                                         "s/global_batch_tokens: 65536/global_batch_tokens: 2048/' ",
                                         rf, "/configs/jobs/gpu-bench.pbtxt > ", root, "/tiny.pbtxt"))
              .rc == 0);
  const testing::ShellOutput out = testing::RunShell(absl::StrCat(
      "OMP_NUM_THREADS=1 /usr/bin/python3 ", rf, "/benchmarks/gpu_vs_torch.py --device-kind cpu --out ", root,
      "/results --bin ", root, "/bin --job ", root, "/tiny.pbtxt --lengths-file ", rf,
      "/tests/data/flan-like-lengths.txt --samples 300 --max-lengths 512 --methods dynamic,packing --iterations 2 "
      "--rounds 1 --torch torch= 2>&1"));
  INFO(out.text);
  REQUIRE(out.rc == 0);
  const testing::ShellOutput table = testing::RunShell(absl::StrCat("cat ", root, "/results/gpu-bench.md"));
  CHECK(table.text.find("| 512 | dynamic |") != std::string::npos);
  CHECK(table.text.find("| 512 | packing |") != std::string::npos);
  CHECK(table.text.find("failures") == std::string::npos);
  // Both of our variants ran (the second with the tiled kernel and separate glue, a no-op on the CPU).
  CHECK(table.text.find("ours-tiled tokens/s") != std::string::npos);
  CHECK(table.text.find("ours / ours-tiled") != std::string::npos);
  // The work folder (dataset, dumps) is temporary: only the two result files stay.
  CHECK(testing::RunShell(absl::StrCat("ls ", root, "/results | wc -l")).text == "2\n");
}

}  // namespace
}  // namespace dynapipe::benchmarks
