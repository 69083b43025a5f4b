// Our layouts against Hugging Face's names and layouts: GPT-2's transposed
// Conv1D weights, T5's split q / k / v, gated halves and per-stack bias
// tables; export then import through a safetensors file gives the same
// bits; and the refusals name the tensor or dimension that is wrong.
#include "runtime/model/hf_checkpoint.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "src/safetensors/safetensors.h"
#include "src/testing/status_require.h"

namespace dynapipe::runtime::model {
namespace {

GptConfig Gpt() {
  return {.num_layers = 2, .hidden = 16, .heads = 2, .ffn = 48, .vocab = 11, .max_positions = 12};
}

GptConfig T5(MlpKind mlp, bool tied) {
  GptConfig c = Gpt();
  c.encoder_decoder = true;
  c.decoder_layers = 3;
  c.norm = NormKind::kRms;
  c.mlp = mlp;
  c.bias = false;
  c.tie_embeddings = tied;
  c.relative_buckets = 8;
  c.relative_max_distance = 16;
  return c;
}

GptLayout Whole(const GptConfig& c) {
  auto l = GptLayout::Make(c, {0, c.TotalLayers(), true, true, 7});
  REQUIRE_OK(l.status());
  return *l;
}

std::vector<float> Initial(const GptLayout& l) {
  std::vector<float> p(l.num_params());
  l.Initialize(p);
  return p;
}

// The tensors as a safetensors file, and a source reading it back.
struct File {
  std::string bytes;
  std::unique_ptr<safetensors::Reader> reader;
  HfSource Source() const {
    return {[this](const std::string& n) -> absl::StatusOr<std::vector<int64_t>> {
              const safetensors::TensorInfo* t = reader->Find(n);
              if (t == nullptr) return absl::NotFoundError(n);
              return t->shape;
            },
            [this](const std::string& n) { return reader->ReadF32(n); }};
  }
};

File Write(const std::vector<HfTensor>& tensors) {
  std::vector<safetensors::TensorOut> out;
  for (const HfTensor& t : tensors) out.push_back(safetensors::F32Tensor(t.name, t.shape, t.data));
  File f;
  auto bytes = safetensors::Serialize(out);
  REQUIRE_OK(bytes.status());
  f.bytes = *bytes;
  auto r = safetensors::Reader::FromBytes(f.bytes);
  REQUIRE_OK(r.status());
  f.reader = std::make_unique<safetensors::Reader>(std::move(*r));
  return f;
}

const HfTensor& Named(const std::vector<HfTensor>& ts, const std::string& name) {
  for (const HfTensor& t : ts) {
    if (t.name == name) return t;
  }
  FAIL("no tensor " << name);
  return ts.front();
}

TEST_CASE("GPT-2 export: Hugging Face's names, Conv1D weights transposed, the tied head left out") {
  const GptLayout l = Whole(Gpt());
  const std::vector<float> params = Initial(l);
  auto hf = ToHuggingFace(l, params);
  REQUIRE_OK(hf.status());
  CHECK(hf->size() == 2 + 2 * 12 + 2);  // wte, wpe, 12 per block, ln_f
  const HfTensor& c_attn = Named(*hf, "transformer.h.1.attn.c_attn.weight");
  CHECK(c_attn.shape == std::vector<int64_t>{16, 48});
  const ParamInfo* qkv = l.FindParam("h.1.attn.qkv.w");  // (48, 16)
  for (int r : {0, 17, 47}) {
    for (int k : {0, 5, 15}) CHECK(c_attn.data[k * 48 + r] == params[qkv->offset + r * 16 + k]);
  }
  CHECK(Named(*hf, "transformer.h.0.mlp.c_fc.weight").shape == std::vector<int64_t>{16, 48});
  CHECK(Named(*hf, "transformer.wpe.weight").shape == std::vector<int64_t>{12, 16});
  for (const HfTensor& t : *hf) CHECK(t.name != "lm_head.weight");
  auto config = HfConfigJson(l.config());
  REQUIRE_OK(config.status());
  CHECK(config->find(R"("architectures":["GPT2LMHeadModel"])") != std::string::npos);
  CHECK(config->find(R"("n_inner":48)") != std::string::npos);
}

TEST_CASE("T5 export: split q, k, v and gated halves, one bias table per stack, the head only when untied") {
  const GptLayout l = Whole(T5(MlpKind::kGatedGelu, /*tied=*/false));
  const std::vector<float> params = Initial(l);
  auto hf = ToHuggingFace(l, params);
  REQUIRE_OK(hf.status());
  const ParamInfo* qkv = l.FindParam("enc.1.attn.qkv.w");  // (48, 16): [q; k; v]
  const HfTensor& k = Named(*hf, "encoder.block.1.layer.0.SelfAttention.k.weight");
  CHECK(k.shape == std::vector<int64_t>{16, 16});
  CHECK(k.data[3 * 16 + 4] == params[qkv->offset + (16 + 3) * 16 + 4]);
  const ParamInfo* kv = l.FindParam("dec.2.xattn.kv.w");  // (32, 16): [k; v]
  CHECK(Named(*hf, "decoder.block.2.layer.1.EncDecAttention.v.weight").data[0] == params[kv->offset + 16 * 16]);
  const ParamInfo* fc = l.FindParam("dec.0.mlp.fc.w");  // (96, 16): gate rows, then up rows
  CHECK(Named(*hf, "decoder.block.0.layer.2.DenseReluDense.wi_1.weight").data[0] == params[fc->offset + 48 * 16]);
  CHECK(Named(*hf, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight").shape ==
        std::vector<int64_t>{8, 2});
  int bias_tables = 0, heads = 0;
  for (const HfTensor& t : *hf) {
    bias_tables += t.name.find("relative_attention_bias") != std::string::npos;
    heads += t.name == "lm_head.weight";
  }
  CHECK(bias_tables == 2);
  CHECK(heads == 1);
  auto config = HfConfigJson(l.config());
  REQUIRE_OK(config.status());
  CHECK(config->find(R"("feed_forward_proj":"gated-gelu")") != std::string::npos);
  CHECK(config->find(R"("num_decoder_layers":3)") != std::string::npos);
}

TEST_CASE("Export then import through safetensors gives the same bits, for every family") {
  for (const GptConfig& c : {Gpt(), T5(MlpKind::kRelu, true), T5(MlpKind::kGatedGelu, false)}) {
    INFO("t5 " << c.encoder_decoder << " mlp " << static_cast<int>(c.mlp));
    const GptLayout l = Whole(c);
    const std::vector<float> params = Initial(l);
    auto hf = ToHuggingFace(l, params);
    REQUIRE_OK(hf.status());
    const File f = Write(*hf);
    std::vector<float> back(l.num_params(), -1.0f);
    REQUIRE_OK(FromHuggingFace(l, f.Source(), back));
    CHECK(back == params);
  }
}

TEST_CASE("Import refuses a checkpoint that does not fit the model, naming the tensor") {
  const GptLayout l = Whole(Gpt());
  auto hf = ToHuggingFace(l, Initial(l));
  REQUIRE_OK(hf.status());
  std::vector<float> back(l.num_params());
  // GPT-2's base-model names (no "transformer.") are taken too.
  std::vector<HfTensor> bare = *hf;
  for (HfTensor& t : bare) {
    if (t.name.rfind("transformer.", 0) == 0) t.name = t.name.substr(12);
  }
  REQUIRE_OK(FromHuggingFace(l, Write(bare).Source(), back));
  std::vector<HfTensor> missing = *hf;
  missing.erase(missing.begin() + 5);
  const absl::Status m = FromHuggingFace(l, Write(missing).Source(), back);
  CHECK(m.message() == "tensor " + (*hf)[5].name + ": not in the checkpoint");
  std::vector<HfTensor> wide = *hf;
  wide[0].shape = {11, 8};
  wide[0].data.resize(88);
  const absl::Status w = FromHuggingFace(l, Write(wide).Source(), back);
  CHECK(w.message() == "tensor transformer.wte.weight: shape [11, 8], the model needs [11, 16]");
  GptConfig relu = Gpt();
  relu.mlp = MlpKind::kRelu;
  CHECK(ToHuggingFace(Whole(relu), Initial(Whole(relu))).status().message().find("GPT2LMHeadModel") !=
        absl::string_view::npos);
  auto stage = GptLayout::Make(Gpt(), {0, 1, true, false, 7});
  REQUIRE_OK(stage.status());
  CHECK(!HfPieces(*stage).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::model

namespace dynapipe::runtime::model {
namespace {

TEST_CASE("config.json both ways: what we write reads back as the same model; what cannot run is named") {
  for (const GptConfig& c : {Gpt(), T5(MlpKind::kRelu, true), T5(MlpKind::kGatedGelu, false)}) {
    auto json = HfConfigJson(c);
    REQUIRE_OK(json.status());
    auto back = ConfigFromHfJson(*json);
    REQUIRE_OK(back.status());
    CHECK(back->encoder_decoder == c.encoder_decoder);
    CHECK(back->hidden == c.hidden);
    CHECK(back->heads == c.heads);
    CHECK(back->ffn == c.ffn);
    CHECK(back->vocab == c.vocab);
    CHECK(back->num_layers == c.num_layers);
    CHECK(back->mlp == c.mlp);
    CHECK(back->norm == c.norm);
    CHECK(back->bias == c.bias);
    CHECK(back->tie_embeddings == c.tie_embeddings);
    if (c.encoder_decoder) {
      CHECK(back->decoder_layers == c.decoder_layers);
      CHECK(back->relative_buckets == c.relative_buckets);
      CHECK(back->relative_max_distance == c.relative_max_distance);
    } else {
      CHECK(back->max_positions == c.max_positions);
    }
  }
  // transformers' defaults for what a config leaves out (n_inner null: 4 x n_embd).
  auto gpt = ConfigFromHfJson(R"({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_inner": null})");
  REQUIRE_OK(gpt.status());
  CHECK(gpt->ffn == 256);
  CHECK(gpt->num_layers == 12);
  CHECK(ConfigFromHfJson(R"({"model_type": "llama"})").status().message().find("model_type \"llama\"") !=
        absl::string_view::npos);
  CHECK(ConfigFromHfJson(R"({"model_type": "t5", "feed_forward_proj": "gated-silu"})").status().message().find(
            "feed_forward_proj") != absl::string_view::npos);
  CHECK(ConfigFromHfJson(R"({"model_type": "t5", "d_model": 64, "num_heads": 4, "d_kv": 8})").status().message().find(
            "d_kv") != absl::string_view::npos);
  CHECK(ConfigFromHfJson(R"({"model_type": "gpt2", "activation_function": "relu"})").status().message().find(
            "activation_function") != absl::string_view::npos);
  // Degenerate buckets (found in review: the bucket of a distance would be
  // undefined and index outside the table) are refused by every T5 layout.
  auto tiny = ConfigFromHfJson(R"({"model_type": "t5", "d_model": 64, "num_heads": 4, "d_kv": 16,
                                   "relative_attention_num_buckets": 2})");
  REQUIRE_OK(tiny.status());
  auto layout = GptLayout::Make(*tiny, {0, tiny->TotalLayers(), true, true, 1});
  CHECK(layout.status().message().find("at least 4 buckets") != absl::string_view::npos);
  GptConfig near = T5(MlpKind::kRelu, true);
  near.relative_max_distance = near.relative_buckets / 2;
  CHECK(!GptLayout::Make(near, {0, near.TotalLayers(), true, true, 1}).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::model
