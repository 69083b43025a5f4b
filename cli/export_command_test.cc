// `dynapipe export` from checkpoint shards: the shards of a split model (a
// T5, a Llama) give the whole model in Hugging Face's layout bit for bit
// (read back with FromHuggingFace), with its config.json; past --max-shard-mb the weights
// are sharded with an index that names every tensor's file; and every
// refusal is one line naming the flag, file or block that is wrong.
#include "cli/export_command.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/model/hf_checkpoint.h"
#include "runtime/model/layout.h"
#include "src/checkpoint/checkpoint.h"
#include "src/common/file_util.h"
#include "src/safetensors/safetensors.h"
#include "src/testing/status_require.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::cli {
namespace {

namespace model = runtime::model;
using Catch::Matchers::Contains;

// A job of `model_text` split over two pipeline stages, checkpoints in dir/ckpt.
std::string WriteJob(const std::string& dir, const std::string& model_text) {
  const std::string path = dir + "/job.pbtxt";
  std::ofstream(path) << "name: \"export-test\"\nmodel { " << model_text << " }\n"
                      << "parallelism { pp: 2 dp: 1 }\n"
                      << "dataset { path: \"data/none\" format: indexed }\n"
                      << "batching { method: dynamic global_batch_tokens: 512 max_seq_len: 64 }\n"
                      << "iterations: 10\nseed: 5\n"
                      << "checkpoint { dir: \"" << dir << "/ckpt\" interval: 5 }\n"
                      << "cluster { name: \"c\" num_nodes: 1 devices_per_node: 2 device { name: \"cpu\" "
                         "peak_tflops: 1 memory_bandwidth_gbps: 10 memory_mb: 4096 } intra_node_bandwidth_gbps: 10 "
                         "inter_node_bandwidth_gbps: 10 }\n";
  return path;
}

// Shards of iteration 5 for stages [0, cut) and [cut, total): the layout's
// initial values (which depend on names only, so they are the whole
// model's); returns the whole model's.
std::vector<float> WriteShards(const std::string& dir, const model::GptConfig& c, int cut) {
  const int total = c.TotalLayers();
  for (int rank = 0; rank < 2; ++rank) {
    const model::StageOptions o{rank == 0 ? 0 : cut, rank == 0 ? cut : total - cut, rank == 0, rank == 1, 5};
    auto layout = model::GptLayout::Make(c, o);
    REQUIRE_OK(layout.status());
    std::vector<float> params(layout->num_params());
    layout->Initialize(params);
    checkpoint::ShardRef s;
    s.iteration = 5;
    s.rank = s.pp_rank = rank;
    s.world = 2;
    for (const model::ParamInfo& p : layout->params()) {
      const std::span<const float> data(params.data() + p.offset, p.size);
      s.params.push_back({p.name, data});
      s.adam_m.push_back({p.name, data});
      s.adam_v.push_back({p.name, data});
    }
    REQUIRE_OK(checkpoint::WriteShard(dir + "/ckpt", s));
  }
  auto whole = model::GptLayout::Make(c, {0, total, true, true, 5});
  REQUIRE_OK(whole.status());
  std::vector<float> params(whole->num_params());
  whole->Initialize(params);
  return params;
}

// The exported files read back through FromHuggingFace.
std::vector<float> Import(const std::string& out, const model::GptConfig& c, std::vector<std::string> files) {
  std::vector<safetensors::Reader> readers;
  for (const std::string& f : files) {
    auto r = safetensors::Reader::Open(out + "/" + f);
    REQUIRE_OK(r.status());
    CHECK(r->metadata().at("format") == "pt");
    readers.push_back(std::move(*r));
  }
  auto find = [&readers](const std::string& n) -> const safetensors::Reader* {
    for (const auto& r : readers) {
      if (r.Find(n) != nullptr) return &r;
    }
    return nullptr;
  };
  model::HfSource src{[&](const std::string& n) -> absl::StatusOr<std::vector<int64_t>> {
                        const auto* r = find(n);
                        if (r == nullptr) return absl::NotFoundError(n);
                        return r->Find(n)->shape;
                      },
                      [&](const std::string& n) { return find(n)->ReadF32(n); }};
  auto whole = model::GptLayout::Make(c, {0, c.TotalLayers(), true, true, 5});
  REQUIRE_OK(whole.status());
  std::vector<float> params(whole->num_params());
  REQUIRE_OK(model::FromHuggingFace(*whole, src, params));
  return params;
}

TEST_CASE("dynapipe export gathers a T5 split over two stages into T5ForConditionalGeneration, bit for bit") {
  const std::string dir = dynapipe::testing::FreshTempDir("export_t5");
  std::filesystem::create_directories(dir);
  const std::string job = WriteJob(dir, "kind: t5 num_layers: 2 num_decoder_layers: 2 hidden: 32 heads: 4 ffn: 64 "
                                        "vocab: 16 max_positions: 64 tie_embeddings: true");
  // The config the job normalises to (T5 v1.0's block).
  model::GptConfig c{.num_layers = 2, .hidden = 32, .heads = 4, .ffn = 64, .vocab = 16, .max_positions = 64};
  c.encoder_decoder = true;
  c.decoder_layers = 2;
  c.norm = model::NormKind::kRms;
  c.mlp = model::MlpKind::kRelu;
  c.bias = false;
  const std::vector<float> want = WriteShards(dir, c, 3);  // the boundary inside the decoder
  std::ostringstream out, err;
  const int rc = RunExportCommand({job, "--out", dir + "/hf"}, out, err);
  INFO(err.str());
  REQUIRE(rc == 0);
  CHECK_THAT(out.str(), Contains("exported iteration 5 of export-test") && Contains("T5ForConditionalGeneration"));
  CHECK(Import(dir + "/hf", c, {"model.safetensors"}) == want);
  auto config = ReadFile(dir + "/hf/config.json");
  REQUIRE_OK(config.status());
  CHECK_THAT(*config, Contains(R"("model_type":"t5")") && Contains(R"("feed_forward_proj":"relu")"));
}

TEST_CASE("dynapipe export gathers a Llama with grouped heads split over two stages into LlamaForCausalLM") {
  const std::string dir = dynapipe::testing::FreshTempDir("export_llama");
  std::filesystem::create_directories(dir);
  const std::string job = WriteJob(dir, "kind: llama num_layers: 3 hidden: 32 heads: 4 kv_heads: 2 ffn: 48 "
                                        "vocab: 16 max_positions: 64 tie_embeddings: false "
                                        "block { rope_base: 500000 }");
  // The config the job normalises to (Llama's block, its eps 1e-5).
  model::GptConfig c{.num_layers = 3, .hidden = 32, .heads = 4, .ffn = 48, .vocab = 16, .max_positions = 64};
  c.tie_embeddings = false;
  c.UseLlamaBlock();
  c.kv_heads = 2;
  c.rope_base = 500000.0f;
  c.norm_eps = 1e-5;
  const std::vector<float> want = WriteShards(dir, c, 2);
  std::ostringstream out, err;
  const int rc = RunExportCommand({job, "--out", dir + "/hf"}, out, err);
  INFO(err.str());
  REQUIRE(rc == 0);
  CHECK_THAT(out.str(), Contains("exported iteration 5 of export-test") && Contains("LlamaForCausalLM"));
  CHECK(Import(dir + "/hf", c, {"model.safetensors"}) == want);
  auto config = ReadFile(dir + "/hf/config.json");
  REQUIRE_OK(config.status());
  CHECK_THAT(*config, Contains(R"("model_type":"llama")") && Contains(R"("num_key_value_heads":2)") &&
                          Contains(R"("rope_theta":500000)") && Contains(R"("rms_norm_eps":1e-05)"));
  auto back = model::ConfigFromHfJson(*config);
  REQUIRE_OK(back.status());
  CHECK(back->KvHeads() == 2);
  CHECK(back->rope_base == 500000.0f);
  CHECK(back->NormEps() == 1e-5);
  CHECK(!back->tie_embeddings);
}

TEST_CASE("dynapipe export shards past --max-shard-mb, with an index naming each tensor's file") {
  const std::string dir = dynapipe::testing::FreshTempDir("export_gpt");
  std::filesystem::create_directories(dir);
  // About 3.2 MB of float32 weights.
  const std::string job = WriteJob(dir, "kind: gpt num_layers: 4 hidden: 128 heads: 4 ffn: 512 vocab: 64 "
                                        "max_positions: 64 tie_embeddings: false");
  model::GptConfig c{.num_layers = 4, .hidden = 128, .heads = 4, .ffn = 512, .vocab = 64, .max_positions = 64};
  c.tie_embeddings = false;
  const std::vector<float> want = WriteShards(dir, c, 2);
  std::ostringstream out, err;
  const int rc = RunExportCommand({job, "--out", dir + "/hf", "--max-shard-mb", "1", "--iteration", "5"}, out, err);
  INFO(err.str());
  REQUIRE(rc == 0);
  std::vector<std::string> files;
  for (int i = 1;; ++i) {
    const std::string f = absl::StrCat("model-0000", i, "-of-0000");
    bool found = false;
    for (const auto& e : std::filesystem::directory_iterator(dir + "/hf")) {
      const std::string name = e.path().filename().string();
      if (name.rfind(f, 0) == 0) {
        files.push_back(name);
        found = true;
      }
    }
    if (!found) break;
  }
  INFO(out.str());
  CHECK(files.size() >= 3);
  CHECK(!std::filesystem::exists(dir + "/hf/model.safetensors"));
  auto index = ReadFile(dir + "/hf/model.safetensors.index.json");
  REQUIRE_OK(index.status());
  CHECK_THAT(*index, Contains(R"("lm_head.weight":"model-0000)") && Contains(R"("total_size":)"));
  CHECK(Import(dir + "/hf", c, files) == want);
}

TEST_CASE("dynapipe export refuses in one line: flags, a missing checkpoint, a block Hugging Face cannot hold") {
  const std::string dir = dynapipe::testing::FreshTempDir("export_bad");
  std::filesystem::create_directories(dir);
  const std::string job = WriteJob(dir, "kind: gpt num_layers: 2 hidden: 32 heads: 4 ffn: 64 vocab: 16 "
                                        "max_positions: 64");
  auto refused = [&](std::vector<std::string> args) {
    std::ostringstream out, err;
    const int rc = RunExportCommand(args, out, err);
    CHECK(rc != 0);
    CHECK(out.str().empty());
    const std::string e = err.str();
    CHECK(std::count(e.begin(), e.end(), '\n') == 1);
    return e;
  };
  CHECK_THAT(refused({job}), Contains("needs --out"));
  CHECK_THAT(refused({job, "--out", dir + "/hf", "--max-shard-mb", "0"}), Contains("--max-shard-mb: must be positive"));
  CHECK_THAT(refused({job, "--out", dir + "/hf", "--iteration", "-2"}), Contains("--iteration"));
  CHECK_THAT(refused({"--out", dir + "/hf"}), Contains("the job file comes first"));
  CHECK_THAT(refused({job, "--out", dir + "/hf"}), Contains("no complete checkpoint in " + dir + "/ckpt"));
  const std::string relu = WriteJob(dir, "kind: gpt num_layers: 2 hidden: 32 heads: 4 ffn: 64 vocab: 16 "
                                         "max_positions: 64 block { mlp: relu }");
  CHECK_THAT(refused({relu, "--out", dir + "/hf"}), Contains("GPT-2's block"));
  CHECK(!std::filesystem::exists(dir + "/hf/config.json"));
}

}  // namespace
}  // namespace dynapipe::cli
