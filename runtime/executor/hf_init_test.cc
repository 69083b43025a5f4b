// model.init_from: stages start from Hugging Face weights. Split stages (T5,
// Llama) take exactly the exported whole model's values (each its own
// tensors); refusals name the file, the config.json field or the tensor;
// and through the plan interpreter a job trained, exported and started
// again from the export carries the very weights on (bit for bit after a
// step of zero learning rate), on one rank and over a 2 x 2 pipeline alike.
#include "runtime/executor/hf_init.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/local_run.h"
#include "runtime/executor/test_dataset.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/gpt.h"
#include "runtime/model/hf_checkpoint.h"
#include "runtime/model/t5.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/safetensors/safetensors.h"
#include "src/safetensors/weight_set.h"
#include "src/testing/status_require.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::runtime::executor {
namespace {

namespace fs = std::filesystem;
using model::GptConfig;

GptConfig T5() {
  GptConfig c{.num_layers = 2, .hidden = 16, .heads = 2, .ffn = 32, .vocab = 13, .max_positions = 32};
  c.encoder_decoder = true;
  c.decoder_layers = 2;
  c.norm = model::NormKind::kRms;
  c.mlp = model::MlpKind::kGatedGelu;
  c.bias = false;
  c.tie_embeddings = false;
  c.relative_buckets = 8;
  c.relative_max_distance = 16;
  return c;
}

// `params` of the whole model `c` exported to dir (model.safetensors, config.json).
void Export(const GptConfig& c, std::span<const float> params, const std::string& dir, uint64_t seed) {
  fs::create_directories(dir);
  auto whole = model::GptLayout::Make(c, {0, c.TotalLayers(), true, true, seed});
  REQUIRE_OK(whole.status());
  auto hf = model::ToHuggingFace(*whole, params);
  REQUIRE_OK(hf.status());
  std::vector<safetensors::TensorOut> out;
  for (const auto& t : *hf) out.push_back(safetensors::F32Tensor(t.name, t.shape, t.data));
  REQUIRE_OK(safetensors::Write(dir + "/model.safetensors", out, {{"format", "pt"}}));
  auto config = model::HfConfigJson(c);
  REQUIRE_OK(config.status());
  REQUIRE_OK(WriteFileAtomic(dir + "/config.json", *config));
}

// Whole-model values unlike the seed's (so a load that did nothing fails).
std::vector<float> Trained(const GptConfig& c) {
  auto whole = model::GptLayout::Make(c, {0, c.TotalLayers(), true, true, 99});
  REQUIRE_OK(whole.status());
  std::vector<float> p(whole->num_params());
  whole->Initialize(p);
  return p;
}

// Llama's block: 2 key-value heads for 4 query heads, an untied head.
GptConfig Llama() {
  GptConfig c{.num_layers = 3, .hidden = 16, .heads = 4, .ffn = 24, .vocab = 13, .max_positions = 32};
  c.UseLlamaBlock();
  c.kv_heads = 2;
  c.norm_eps = 1e-5;
  c.tie_embeddings = false;
  return c;
}

std::vector<std::unique_ptr<model::Stage>> Stages(const GptConfig& c, BufferPool* pool, int cut) {
  std::vector<std::unique_ptr<model::Stage>> out;
  for (auto [first, n] : {std::pair{0, cut}, {cut, c.TotalLayers() - cut}}) {
    const model::StageOptions o{first, n, first == 0, first + n == c.TotalLayers(), 5};
    if (c.encoder_decoder) {
      auto s = model::T5Stage::Create(c, o, pool);
      REQUIRE_OK(s.status());
      out.push_back(std::move(*s));
    } else {
      auto s = model::GptStage::Create(c, o, pool);
      REQUIRE_OK(s.status());
      out.push_back(std::move(*s));
    }
  }
  return out;
}

TEST_CASE("init_from: split stages take the exported model's values, each reading its own tensors") {
  for (const GptConfig& c : {T5(), Llama()}) {
    INFO(model::HfArchitecture(c));
    const std::string dir = dynapipe::testing::FreshTempDir("hf_init_split");
    const std::vector<float> want = Trained(c);
    Export(c, want, dir + "/hf", 99);
    auto whole = model::GptLayout::Make(c, {0, c.TotalLayers(), true, true, 5});
    REQUIRE_OK(whole.status());
    BufferPool pool(CpuAllocator());
    for (int cut = 1; cut < c.TotalLayers(); ++cut) {
      INFO("cut at " << cut);
      auto stages = Stages(c, &pool, cut);
      REQUIRE_OK(InitFromHuggingFace(dir + "/hf", stages));
      int64_t checked = 0;
      for (const auto& s : stages) {
        model::StageState st;
        REQUIRE_OK(s->ExportState(&st));
        for (const model::ParamInfo& p : s->layout().params()) {
          const model::ParamInfo* w = whole->FindParam(p.name);
          REQUIRE(w != nullptr);
          CHECK(std::equal(st.params.begin() + p.offset, st.params.begin() + p.offset + p.size,
                           want.begin() + w->offset));
          checked += p.size;
        }
        CHECK(std::all_of(st.adam_m.begin(), st.adam_m.end(), [](float x) { return x == 0.0f; }));
      }
      CHECK(checked >= static_cast<int64_t>(whole->num_params()));
    }
  }
}

TEST_CASE("init_from refuses in one line: a missing file, another model type or head count, a missing tensor") {
  const GptConfig c = T5();
  const std::string dir = dynapipe::testing::FreshTempDir("hf_init_bad");
  Export(c, Trained(c), dir + "/hf", 99);
  BufferPool pool(CpuAllocator());
  auto stages = Stages(c, &pool, 2);
  auto refusal = [&](const std::string& path) {
    const absl::Status s = InitFromHuggingFace(path, stages);
    REQUIRE_FALSE(s.ok());
    const std::string m(s.message());
    CHECK(m.rfind("model.init_from: ", 0) == 0);
    CHECK(m.find('\n') == std::string::npos);
    return m;
  };
  CHECK(refusal(dir + "/nothing").find("No such file") != std::string::npos);
  GptConfig heads = c;
  heads.heads = 4;
  auto other = model::HfConfigJson(heads);
  REQUIRE_OK(WriteFileAtomic(dir + "/hf/config.json", *other));
  CHECK(refusal(dir + "/hf").find("config.json: num_heads 4; the job's model.heads is 2") != std::string::npos);
  REQUIRE_OK(WriteFileAtomic(dir + "/hf/config.json", R"({"model_type": "gpt2"})"));
  CHECK(refusal(dir + "/hf").find("model_type \"gpt2\"") != std::string::npos);
  // A T5 v1.0 export (one wi, not wi_0 and wi_1) for this T5 v1.1 job.
  GptConfig relu = c;
  relu.mlp = model::MlpKind::kRelu;
  Export(relu, Trained(relu), dir + "/v10", 99);
  CHECK(refusal(dir + "/v10").find("tensor encoder.block.0.layer.1.DenseReluDense.wi_0.weight: not in the checkpoint") !=
        std::string::npos);
}

TEST_CASE("init_from refuses a Llama checkpoint for other key-value heads, without its head, or with RoPE scaling") {
  const GptConfig c = Llama();
  const std::string dir = dynapipe::testing::FreshTempDir("hf_init_llama_bad");
  BufferPool pool(CpuAllocator());
  auto stages = Stages(c, &pool, 1);
  auto refusal = [&](const std::string& path) {
    const absl::Status s = InitFromHuggingFace(path, stages);
    REQUIRE_FALSE(s.ok());
    const std::string m(s.message());
    CHECK(m.find('\n') == std::string::npos);
    return m;
  };
  // A key-value head per head: config.json says so first; without it, k_proj's rows.
  GptConfig mha = c;
  mha.kv_heads = 4;
  Export(mha, Trained(mha), dir + "/mha", 99);
  CHECK(refusal(dir + "/mha") == "model.init_from: config.json: num_key_value_heads 4; the job's model.kv_heads is 2");
  fs::remove(dir + "/mha/config.json");
  CHECK(refusal(dir + "/mha") ==
        "model.init_from: tensor model.layers.0.self_attn.k_proj.weight: shape [16, 16], the model needs [8, 16]");
  // A tied export for this untied job has no lm_head: config.json says why;
  // without it, the missing tensor does.
  GptConfig tied = c;
  tied.tie_embeddings = true;
  Export(tied, Trained(tied), dir + "/tied", 99);
  CHECK(refusal(dir + "/tied") ==
        "model.init_from: config.json: tie_word_embeddings true; the job's model.tie_embeddings is false");
  fs::remove(dir + "/tied/config.json");
  CHECK(refusal(dir + "/tied") == "model.init_from: tensor lm_head.weight: not in the checkpoint");
  // RoPE scaling (Llama 3.1's) is not what our rotary positions compute.
  Export(c, Trained(c), dir + "/scaled", 99);
  REQUIRE_OK(InitFromHuggingFace(dir + "/scaled", stages));
  REQUIRE_OK(WriteFileAtomic(dir + "/scaled/config.json",
                             R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})"));
  CHECK(refusal(dir + "/scaled").rfind("model.init_from: config.json: rope_scaling: only plain RoPE", 0) == 0);
}

proto::JobSpec Spec(const std::string& dataset, int pp, int dp, double lr) {
  proto::JobSpec spec;
  const std::string text = absl::StrCat(R"pb(
    name: "init-from-test"
    model { name: "t" kind: gpt num_layers: 4 hidden: 32 heads: 4 ffn: 64 vocab: 32 max_positions: 80
            dtype: fp32 tie_embeddings: true }
    dataset { path: ")pb", dataset, R"pb(" format: indexed }
    batching { method: dynamic global_batch_tokens: 900 max_seq_len: 80 round_multiple: 8 }
    optimizer { lr: )pb", lr, R"pb( grad_clip: 1.0 weight_decay: 0 lr_schedule { kind: constant } }
    iterations: 5
    seed: 3
    cluster { name: "cpu" num_nodes: 1 devices_per_node: 4
              device { name: "cpu" peak_tflops: 0.05 memory_bandwidth_gbps: 10 memory_mb: 4096 }
              intra_node_bandwidth_gbps: 20 inter_node_bandwidth_gbps: 20 }
    parallelism { pp: )pb", pp, " dp: ", dp, " }");
  REQUIRE(ParseTextProto(text, "spec", &spec).ok());
  return spec;
}

TEST_CASE("A trained job exported and started again from the export carries its weights on", "[executor]") {
  const std::string ds = testing::WorkerTestDataset("hf_init_ds");
  const std::string dir = dynapipe::testing::FreshTempDir("hf_init_run");
  auto trained = cli::RunLocal(Spec(ds, 1, 1, 3e-3), "/", 3);
  REQUIRE_OK(trained.status());
  const std::vector<float>& after = trained->final_params[0];  // one rank: the whole model
  GptConfig c{.num_layers = 4, .hidden = 32, .heads = 4, .ffn = 64, .vocab = 32, .max_positions = 80};
  Export(c, after, dir + "/hf", 3);

  // One step at the smallest learning rate a job takes (1e-12: AdamW moves
  // each weight by about that) leaves the loaded weights where they were, far
  // from the seed's.
  proto::JobSpec again = Spec(ds, 1, 1, 1e-12);
  again.mutable_model()->set_init_from(dir + "/hf");
  auto one = cli::RunLocal(again, "/", 1);
  REQUIRE_OK(one.status());
  REQUIRE(one->final_params[0].size() == after.size());
  double moved = 0, from_seed = 0;
  auto fresh = cli::RunLocal(Spec(ds, 1, 1, 1e-12), "/", 1);
  REQUIRE_OK(fresh.status());
  for (size_t i = 0; i < after.size(); ++i) {
    moved = std::max(moved, static_cast<double>(std::abs(one->final_params[0][i] - after[i])));
    from_seed = std::max(from_seed, static_cast<double>(std::abs(fresh->final_params[0][i] - after[i])));
  }
  CHECK(moved <= 1e-11);
  CHECK(from_seed > 1e-4);
  const double loss = one->per_rank[0][0].loss;
  // Different from a fresh start: the trained model has learnt.
  CHECK(loss < fresh->per_rank[0][0].loss - 0.01);

  // Over a 2 x 2 pipeline: every stage loads its part, replicas alike, and
  // the first iteration's loss is the one rank's (summed in another order).
  proto::JobSpec split = again;
  split.mutable_parallelism()->set_pp(2);
  split.mutable_parallelism()->set_dp(2);
  auto four = cli::RunLocal(split, "/", 1);
  REQUIRE_OK(four.status());
  for (int r = 0; r < 4; ++r) CHECK(std::abs(four->per_rank[r][0].loss - loss) <= 1e-5 * loss);
  CHECK(four->final_params[0] == four->final_params[2]);
  CHECK(four->final_params[1] == four->final_params[3]);
}

TEST_CASE("export_dir: the job writes its trained model at its end, the very weights it ends with", "[executor]") {
  const std::string ds = testing::WorkerTestDataset("hf_export_ds");
  const std::string dir = dynapipe::testing::FreshTempDir("hf_export_end");
  proto::JobSpec spec = Spec(ds, 1, 1, 3e-3);
  spec.set_iterations(3);
  spec.set_export_dir(dir + "/end");
  auto run = cli::RunLocal(spec, "/", 3);
  REQUIRE_OK(run.status());
  auto weights = safetensors::WeightSet::Open(dir + "/end");
  REQUIRE_OK(weights.status());
  CHECK(weights->config_json().find("GPT2LMHeadModel") != std::string::npos);
  GptConfig c{.num_layers = 4, .hidden = 32, .heads = 4, .ffn = 64, .vocab = 32, .max_positions = 80};
  auto whole = model::GptLayout::Make(c, {0, 4, true, true, 3});
  REQUIRE_OK(whole.status());
  std::vector<float> back(whole->num_params());
  REQUIRE_OK(model::FromHuggingFace(*whole, model::WeightsSource(*weights), back));
  CHECK(back == run->final_params[0]);  // one rank: the whole model, in layout order

  // Over a 2 x 2 pipeline the stages' tensors meet in one file, every shared
  // one once (tests/integration:executor_test compares such an export with
  // the export of the job's last checkpoint, tensor by tensor).
  proto::JobSpec split = spec;
  split.mutable_parallelism()->set_pp(2);
  split.mutable_parallelism()->set_dp(2);
  split.set_export_dir(dir + "/split");
  auto four = cli::RunLocal(split, "/", 3);
  REQUIRE_OK(four.status());
  auto loaded = safetensors::WeightSet::Open(dir + "/split");
  REQUIRE_OK(loaded.status());
  CHECK(loaded->size() == weights->size());
}

}  // namespace
}  // namespace dynapipe::runtime::executor
