// Our models in Hugging Face's format against an independent implementation:
// each family's whole CPU stage is exported (runtime/model/hf_checkpoint.h,
// safetensors, config.json) with its logits on a batch, and
// tests/golden/hf_reference.py (GPT-2, T5 and Llama written from Hugging
// Face's architectures over the exported tensors by their names, float64)
// must give the same logits within 1e-5 relative; Llama's batch packs two
// samples into a row, so rotary positions restart inside it. Mutation
// checks: exporting a GPT-2 without transposing one Conv1D weight, or a
// Llama with gate and up (or k and v) swapped, fails it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/gpt.h"
#include "runtime/model/hf_checkpoint.h"
#include "runtime/model/t5.h"
#include "src/common/file_util.h"
#include "src/safetensors/safetensors.h"
#include "src/testing/shell.h"
#include "src/testing/status_require.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::runtime::model {
namespace {

using dynapipe::testing::RunShell;

constexpr int kRows = 2, kSeq = 9, kEncSeq = 11, kVocab = 53;

GptConfig Gpt(bool tied) {
  GptConfig c{.num_layers = 2, .hidden = 32, .heads = 4, .ffn = 80, .vocab = kVocab, .max_positions = 16};
  c.tie_embeddings = tied;
  return c;
}

GptConfig T5(MlpKind mlp, bool tied) {
  GptConfig c = Gpt(tied);
  c.encoder_decoder = true;
  c.decoder_layers = 3;
  c.norm = NormKind::kRms;
  c.mlp = mlp;
  c.bias = false;
  c.relative_buckets = 8;
  c.relative_max_distance = 20;
  return c;
}

// Llama's block with 2 key-value heads for 4 query heads, a rope base and
// norm eps other than the defaults.
GptConfig Llama(bool tied) {
  GptConfig c = Gpt(tied);
  c.UseLlamaBlock();
  c.kv_heads = 2;
  c.rope_base = 500000.0f;
  c.norm_eps = 1e-5;
  return c;
}

std::vector<int32_t> RandomTokens(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = 1 + static_cast<int32_t>(rng() % (kVocab - 1));
  return t;
}

// Rows without padding, one sample each (what the Hugging Face classes
// compute without an attention mask), except that with rotary positions the
// first row packs two samples (4 and 5 tokens), which the reference reads
// from `segments`.
TokenBatch Batch(const GptConfig& c) {
  TokenBatch b;
  b.rows = kRows;
  b.seq = kSeq;
  b.tokens = RandomTokens(kRows * kSeq, 3);
  b.positions.resize(kRows * kSeq);
  b.segments.assign(kRows * kSeq, 0);
  if (c.rotary) std::fill(b.segments.begin() + 4, b.segments.begin() + kSeq, 1);
  for (int i = 0; i < kRows * kSeq; ++i) {
    const bool start = i % kSeq == 0 || b.segments[i] != b.segments[i - 1];
    b.positions[i] = start ? 0 : b.positions[i - 1] + 1;
  }
  b.targets.assign(kRows * kSeq, 0);
  if (c.encoder_decoder) {
    b.enc_seq = kEncSeq;
    b.enc_tokens = RandomTokens(kRows * kEncSeq, 4);
    b.enc_segments.assign(kRows * kEncSeq, 0);
    for (int r = 0; r < kRows; ++r) b.tokens[r * kSeq] = 0;  // the decoder starts from pad
  }
  return b;
}

using Corruption = std::function<void(std::vector<HfTensor>&)>;

// Exports `config`'s initial model to `dir` with our logits on Batch(), then
// runs the reference; its output. `corrupt` edits the exported tensors.
dynapipe::testing::ShellOutput ExportAndCheck(const GptConfig& config, const std::string& dir,
                                              const Corruption& corrupt = {}) {
  std::filesystem::create_directories(dir);
  BufferPool pool(CpuAllocator());
  const StageOptions whole{0, config.TotalLayers(), true, true, 11};
  std::unique_ptr<CpuStageBase> stage;
  if (config.encoder_decoder) {
    auto s = T5Stage::Create(config, whole, &pool);
    REQUIRE_OK(s.status());
    stage = std::move(*s);
  } else {
    auto s = GptStage::Create(config, whole, &pool);
    REQUIRE_OK(s.status());
    stage = std::move(*s);
  }
  const TokenBatch batch = Batch(config);
  std::vector<float> logits(static_cast<size_t>(kRows * kSeq * kVocab));
  REQUIRE_OK(stage->Infer(batch, nullptr, logits.data()));

  auto hf = ToHuggingFace(stage->layout(), stage->param_data());
  REQUIRE_OK(hf.status());
  if (corrupt) corrupt(*hf);
  std::vector<safetensors::TensorOut> out;
  for (const HfTensor& t : *hf) out.push_back(safetensors::F32Tensor(t.name, t.shape, t.data));
  REQUIRE_OK(safetensors::Write(dir + "/model.safetensors", out, {{"format", "pt"}}));
  auto config_json = HfConfigJson(config);
  REQUIRE_OK(config_json.status());
  REQUIRE_OK(WriteFileAtomic(dir + "/config.json", *config_json));

  auto ints = [](const std::string& name, const std::vector<int32_t>& v, int64_t rows) {
    return safetensors::TensorOut{name, safetensors::DType::kI32, {rows, static_cast<int64_t>(v.size()) / rows},
                                  {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t)}};
  };
  std::vector<safetensors::TensorOut> expected = {
      safetensors::F32Tensor("logits", {kRows * kSeq, kVocab}, logits)};
  if (config.encoder_decoder) {
    expected.push_back(ints("enc_tokens", batch.enc_tokens, kRows));
    expected.push_back(ints("dec_tokens", batch.tokens, kRows));
  } else {
    expected.push_back(ints("tokens", batch.tokens, kRows));
  }
  if (config.rotary) expected.push_back(ints("segments", batch.segments, kRows));
  REQUIRE_OK(safetensors::Write(dir + "/expected.safetensors", expected));
  return RunShell(absl::StrCat("/usr/bin/python3 ", dynapipe::testing::Runfiles(),
                               "/tests/golden/hf_reference.py ", dir));
}

HfTensor& Find(std::vector<HfTensor>& ts, const std::string& name) {
  for (HfTensor& t : ts) {
    if (t.name == name) return t;
  }
  FAIL("no tensor " << name);
  return ts.front();
}

// The values of two tensors of one shape exchanged.
Corruption Swap(const std::string& a, const std::string& b) {
  return [a, b](std::vector<HfTensor>& ts) { std::swap(Find(ts, a).data, Find(ts, b).data); };
}

TEST_CASE("Exported GPT-2, T5 and Llama models give our logits under an independent Hugging Face-named reference") {
  const std::string root = dynapipe::testing::FreshTempDir("hf_export");
  struct Case {
    const char* name;
    GptConfig config;
  };
  for (const Case& c : {Case{"gpt2-tied", Gpt(true)}, Case{"gpt2-untied", Gpt(false)},
                        Case{"t5-v1.0-tied", T5(MlpKind::kRelu, true)},
                        Case{"t5-v1.1-untied", T5(MlpKind::kGatedGelu, false)}, Case{"llama-tied", Llama(true)},
                        Case{"llama-untied", Llama(false)}}) {
    const auto run = ExportAndCheck(c.config, root + "/" + c.name);
    INFO(c.name << ": " << run.text);
    CHECK(run.rc == 0);
    CHECK(run.text.find("relative error") != std::string::npos);
  }
  // Not vacuous: one Conv1D weight left in our (out, in) layout fails it,
  // and so do Llama's gate and up, or k and v, exchanged in one layer.
  const Corruption untransposed = [](std::vector<HfTensor>& ts) {
    HfTensor& t = Find(ts, "transformer.h.1.attn.c_proj.weight");  // (C, C): the same shape untransposed
    const std::vector<float> d = t.data;
    const int64_t n = t.shape[0];
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t k = 0; k < n; ++k) t.data[r * n + k] = d[k * n + r];
    }
  };
  struct Bad {
    const char* name;
    GptConfig config;
    Corruption corrupt;
  };
  for (const Bad& b :
       {Bad{"gpt2-untransposed", Gpt(true), untransposed},
        Bad{"llama-gate-up", Llama(false), Swap("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight")},
        Bad{"llama-k-v", Llama(false),
            Swap("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight")}}) {
    const auto bad = ExportAndCheck(b.config, root + "/" + b.name, b.corrupt);
    INFO(b.name << ": " << bad.text);
    CHECK(bad.rc == 1);
    CHECK(bad.text.find("relative error") != std::string::npos);
  }
}

TEST_CASE("Weights written in Hugging Face's layout by another writer load into our model with its logits") {
  // The other direction: hf_reference.py writes random weights by Hugging
  // Face's names and layouts with its own writer, and its float64 logits;
  // hf_logits loads them through WeightSet and FromHuggingFace into our CPU
  // model and compares.
  const std::string root = dynapipe::testing::FreshTempDir("hf_import");
  const std::string runfiles = dynapipe::testing::Runfiles();
  for (const char* kind : {"gpt2", "t5", "t5-v1.1", "llama"}) {
    const std::string dir = absl::StrCat(root, "/", kind);
    const auto made = RunShell(absl::StrCat("/usr/bin/python3 ", runfiles, "/tests/golden/hf_reference.py --make ", kind,
                                            " ", dir));
    INFO(made.text);
    REQUIRE(made.rc == 0);
    const auto run = RunShell(absl::StrCat(runfiles, "/tests/golden/hf_logits --model ", dir, " --expected ", dir,
                                           "/expected.safetensors --tolerance 1e-5"));
    INFO(kind << ": " << run.text);
    CHECK(run.rc == 0);
    CHECK(run.text.find("relative error") != std::string::npos);
  }
}

}  // namespace
}  // namespace dynapipe::runtime::model
