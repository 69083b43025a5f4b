// Our layouts against Hugging Face's names and layouts: GPT-2's transposed
// Conv1D weights, T5's split q / k / v, gated halves and per-stack bias
// tables, Llama's q / k / v with fewer key-value heads and gate / up halves;
// export then import through a safetensors file gives the same bits; and
// the refusals name the tensor, dimension or config.json field that is
// wrong.
#include "runtime/model/hf_checkpoint.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Llama's block: 4 query heads of 4, 2 key-value heads, a rope base and
// norm eps unlike the defaults.
GptConfig Llama(bool tied) {
  GptConfig c{.num_layers = 2, .hidden = 16, .heads = 4, .ffn = 24, .vocab = 11, .max_positions = 12};
  c.UseLlamaBlock();
  c.kv_heads = 2;
  c.rope_base = 500000.0f;
  c.norm_eps = 1e-5;
  c.tie_embeddings = tied;
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

TEST_CASE("Llama export: q, k, v of their own head counts, gate and up halves, untransposed, the head when untied") {
  const GptLayout l = Whole(Llama(/*tied=*/false));
  const std::vector<float> params = Initial(l);
  auto hf = ToHuggingFace(l, params);
  REQUIRE_OK(hf.status());
  CHECK(hf->size() == 1 + 2 * 9 + 2);  // embed_tokens, 9 per layer, norm, lm_head
  const ParamInfo* qkv = l.FindParam("h.1.attn.qkv.w");  // (16 + 8 + 8, 16): [q; k; v]
  REQUIRE(qkv->shape == std::vector<int64_t>{32, 16});
  const HfTensor& q = Named(*hf, "model.layers.1.self_attn.q_proj.weight");
  const HfTensor& k = Named(*hf, "model.layers.1.self_attn.k_proj.weight");
  const HfTensor& v = Named(*hf, "model.layers.1.self_attn.v_proj.weight");
  CHECK(q.shape == std::vector<int64_t>{16, 16});
  CHECK(k.shape == std::vector<int64_t>{8, 16});
  CHECK(v.shape == std::vector<int64_t>{8, 16});
  for (int r : {0, 5, 7}) {
    for (int c : {0, 3, 15}) {
      CHECK(q.data[r * 16 + c] == params[qkv->offset + r * 16 + c]);
      CHECK(k.data[r * 16 + c] == params[qkv->offset + (16 + r) * 16 + c]);
      CHECK(v.data[r * 16 + c] == params[qkv->offset + (24 + r) * 16 + c]);
    }
  }
  const ParamInfo* fc = l.FindParam("h.0.mlp.fc.w");  // (48, 16): gate rows, then up rows
  const HfTensor& gate = Named(*hf, "model.layers.0.mlp.gate_proj.weight");
  const HfTensor& up = Named(*hf, "model.layers.0.mlp.up_proj.weight");
  CHECK(gate.shape == std::vector<int64_t>{24, 16});
  CHECK(gate.data[2 * 16 + 9] == params[fc->offset + 2 * 16 + 9]);
  CHECK(up.data[2 * 16 + 9] == params[fc->offset + (24 + 2) * 16 + 9]);
  const ParamInfo* down = l.FindParam("h.0.mlp.proj.w");  // (16, 24), as Linear stores it
  CHECK(Named(*hf, "model.layers.0.mlp.down_proj.weight").shape == std::vector<int64_t>{16, 24});
  CHECK(Named(*hf, "model.layers.0.mlp.down_proj.weight").data[1 * 24 + 20] == params[down->offset + 1 * 24 + 20]);
  CHECK(Named(*hf, "model.norm.weight").shape == std::vector<int64_t>{16});
  CHECK(Named(*hf, "lm_head.weight").shape == std::vector<int64_t>{11, 16});
  auto tied = ToHuggingFace(Whole(Llama(true)), Initial(Whole(Llama(true))));
  REQUIRE_OK(tied.status());
  CHECK(tied->size() == hf->size() - 1);
  for (const HfTensor& t : *tied) CHECK(t.name != "lm_head.weight");
  auto config = HfConfigJson(l.config());
  REQUIRE_OK(config.status());
  for (const char* field : {R"("architectures":["LlamaForCausalLM"])", R"("model_type":"llama")",
                            R"("num_attention_heads":4)", R"("num_key_value_heads":2)", R"("head_dim":4)",
                            R"("intermediate_size":24)", R"("rms_norm_eps":1e-05)", R"("rope_theta":500000)",
                            R"("rope_scaling":null)", R"("rope_parameters":{"rope_type":"default","rope_theta":500000})",
                            R"("hidden_act":"silu")", R"("attention_bias":false)",
                            R"("tie_word_embeddings":false)"}) {
    CHECK_THAT(*config, Catch::Matchers::Contains(field));
  }
}

TEST_CASE("Export then import through safetensors gives the same bits, for every family") {
  for (const GptConfig& c : {Gpt(), T5(MlpKind::kRelu, true), T5(MlpKind::kGatedGelu, false), Llama(true),
                             Llama(false)}) {
    INFO("t5 " << c.encoder_decoder << " rotary " << c.rotary << " mlp " << static_cast<int>(c.mlp) << " tied "
               << c.tie_embeddings);
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

TEST_CASE("Llama stages read their own tensors of an export; a checkpoint for other heads or without its head is refused") {
  for (bool tied : {true, false}) {
    INFO("tied " << tied);
    const GptConfig c = Llama(tied);
    const GptLayout whole = Whole(c);
    const std::vector<float> params = Initial(whole);
    auto hf = ToHuggingFace(whole, params);
    REQUIRE_OK(hf.status());
    const File f = Write(*hf);
    for (const StageOptions& o : {StageOptions{0, 1, true, false, 3}, StageOptions{1, 1, false, true, 3}}) {
      auto stage = GptLayout::Make(c, o);
      REQUIRE_OK(stage.status());
      std::vector<float> got(stage->num_params(), -1.0f);
      REQUIRE_OK(FromHuggingFace(*stage, f.Source(), got));
      for (const ParamInfo& p : stage->params()) {
        INFO(p.name);
        const ParamInfo* w = whole.FindParam(p.name);
        REQUIRE(w != nullptr);
        CHECK(std::equal(got.begin() + p.offset, got.begin() + p.offset + p.size, params.begin() + w->offset));
      }
    }
  }
  const GptLayout l = Whole(Llama(false));
  auto hf = ToHuggingFace(l, Initial(l));
  REQUIRE_OK(hf.status());
  std::vector<float> back(l.num_params());
  // LlamaModel's names (no "model.") are taken too.
  std::vector<HfTensor> bare = *hf;
  for (HfTensor& t : bare) {
    if (t.name.rfind("model.", 0) == 0) t.name = t.name.substr(6);
  }
  REQUIRE_OK(FromHuggingFace(l, Write(bare).Source(), back));
  // A multi-head export (a key-value head per head) for this grouped model.
  GptConfig mha = Llama(false);
  mha.kv_heads = 4;
  auto wide = ToHuggingFace(Whole(mha), Initial(Whole(mha)));
  REQUIRE_OK(wide.status());
  CHECK(FromHuggingFace(l, Write(*wide).Source(), back).message() ==
        "tensor model.layers.0.self_attn.k_proj.weight: shape [16, 16], the model needs [8, 16]");
  // A tied export for this untied model: no lm_head.
  auto tied = ToHuggingFace(Whole(Llama(true)), Initial(Whole(Llama(true))));
  REQUIRE_OK(tied.status());
  CHECK(FromHuggingFace(l, Write(*tied).Source(), back).message() == "tensor lm_head.weight: not in the checkpoint");
  // A rotary decoder without Llama's block, and a GPT-2 block with grouped heads, have no class.
  GptConfig layernorm = Llama(true);
  layernorm.norm = NormKind::kLayerNorm;
  CHECK_THAT(std::string(ToHuggingFace(Whole(layernorm), Initial(Whole(layernorm))).status().message()),
             Catch::Matchers::Contains("LlamaForCausalLM"));
  CHECK_THAT(std::string(HfConfigJson(layernorm).status().message()), Catch::Matchers::Contains("Llama's block"));
  GptConfig grouped = Gpt();
  grouped.kv_heads = 1;
  CHECK_THAT(std::string(ToHuggingFace(Whole(grouped), Initial(Whole(grouped))).status().message()),
             Catch::Matchers::Contains("GPT2LMHeadModel"));
  CHECK(!HfConfigJson(grouped).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::model

namespace dynapipe::runtime::model {
namespace {

TEST_CASE("config.json both ways: what we write reads back as the same model; what cannot run is named") {
  for (const GptConfig& c : {Gpt(), T5(MlpKind::kRelu, true), T5(MlpKind::kGatedGelu, false), Llama(true),
                             Llama(false)}) {
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
    CHECK(back->rotary == c.rotary);
    CHECK(back->KvHeads() == c.KvHeads());
    CHECK(back->NormEps() == c.NormEps());
    CHECK(back->rope_base == c.rope_base);
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
  CHECK(ConfigFromHfJson(R"({"model_type": "mistral"})").status().message().find("model_type \"mistral\"") !=
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

TEST_CASE("Llama's config.json: LlamaConfig's defaults; what our block cannot run is refused, naming the field") {
  auto llama = ConfigFromHfJson(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8,
                                    "rope_scaling": null, "rms_norm_eps": 1e-5})");
  REQUIRE_OK(llama.status());
  CHECK(llama->KvHeads() == 8);  // num_key_value_heads absent: one per head
  CHECK(!llama->tie_embeddings);
  CHECK(llama->ffn == 11008);
  CHECK(llama->num_layers == 32);
  CHECK(llama->vocab == 32000);
  CHECK(llama->rope_base == 10000.0f);
  CHECK(llama->NormEps() == 1e-5);
  CHECK(llama->mlp == MlpKind::kSwiglu);
  CHECK(llama->norm == NormKind::kRms);
  CHECK(!llama->bias);
  CHECK(ConfigFromHfJson(R"({"model_type": "llama"})")->NormEps() == 1e-6);
  REQUIRE_OK(ConfigFromHfJson(R"({"model_type": "llama", "rope_scaling": {"rope_type": "default"}})").status());
  // transformers 5's form: RoPE's settings in rope_parameters.
  auto v5 = ConfigFromHfJson(R"({"model_type": "llama", "rope_parameters": {"rope_type": "default",
                                 "rope_theta": 500000.0}})");
  REQUIRE_OK(v5.status());
  CHECK(v5->rope_base == 500000.0f);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"("rope_scaling": {"type": "linear", "factor": 2.0})", "config.json: rope_scaling: only plain RoPE (null)"},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "config.json: rope_scaling"},
      {R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 4.0})",
       "config.json: rope_parameters: only plain RoPE"},
      {R"("rope_theta": "10000")", "config.json: rope_theta: not a number"},
      {R"("attention_bias": true)", "config.json: attention_bias: true"},
      {R"("mlp_bias": true)", "config.json: mlp_bias: true"},
      {R"("hidden_act": "gelu")", "config.json: hidden_act \"gelu\""},
      {R"("hidden_size": 64, "num_attention_heads": 4, "head_dim": 32)", "config.json: head_dim: 32; must be"},
      {R"("hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3)",
       "config.json: num_key_value_heads: 3 does not divide num_attention_heads 4"},
      {R"("hidden_size": 60, "num_attention_heads": 8)", "config.json: num_attention_heads: 8 does not divide"},
      {R"("hidden_size": 60, "num_attention_heads": 20)", "config.json: head_dim: rotary positions need an even"},
      {R"("hidden_size": 1e300)", "config.json: hidden_size: "},
      {R"("num_hidden_layers": 2.5)", "config.json: num_hidden_layers: "},
      {R"("rope_theta": -1)", "config.json: rope_theta: must be"},
      {R"("rms_norm_eps": 0)", "config.json: rms_norm_eps: must be"},
  };
  for (const auto& [fields, want] : refused) {
    INFO(fields);
    const absl::Status s = ConfigFromHfJson(absl::StrCat(R"({"model_type": "llama", )", fields, "}")).status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Matchers::StartsWith(want));
  }
}

TEST_CASE("A config.json beside weights must describe the job's model where no tensor shows it") {
  const GptConfig c = Llama(false);
  auto json = HfConfigJson(c);
  REQUIRE_OK(json.status());
  REQUIRE_OK(CheckHfConfig(*json, c));
  REQUIRE_OK(CheckHfConfig("", c));
  // What it leaves out reads as transformers' defaults: rms_norm_eps 1e-6, untied.
  REQUIRE_OK(CheckHfConfig(R"({"model_type": "llama", "rms_norm_eps": 1e-5})", c));
  CHECK(CheckHfConfig(R"({"model_type": "llama"})", c).message() ==
        "config.json: rms_norm_eps 1e-06; the job's model.block.norm_eps is 1e-05");
  auto other = [&](void (*edit)(GptConfig&)) {
    GptConfig o = c;
    edit(o);
    auto j = HfConfigJson(o);
    REQUIRE_OK(j.status());
    return std::string(CheckHfConfig(*j, c).message());
  };
  CHECK(other([](GptConfig& o) { o.heads = 2; }) == "config.json: num_attention_heads 2; the job's model.heads is 4");
  CHECK(other([](GptConfig& o) { o.kv_heads = 4; }) == "config.json: num_key_value_heads 4; the job's model.kv_heads is 2");
  CHECK(other([](GptConfig& o) { o.rope_base = 10000.0f; }) ==
        "config.json: rope_theta 10000; the job's model.block.rope_base is 500000");
  CHECK(other([](GptConfig& o) { o.norm_eps = 1e-6; }) ==
        "config.json: rms_norm_eps 1e-06; the job's model.block.norm_eps is 1e-05");
  CHECK(other([](GptConfig& o) { o.tie_embeddings = true; }) ==
        "config.json: tie_word_embeddings true; the job's model.tie_embeddings is false");
  // GPT-2 and T5 write and check their layer_norm_epsilon too.
  GptConfig g = Gpt();
  g.norm_eps = 1e-6;
  auto g_json = HfConfigJson(g);
  REQUIRE_OK(g_json.status());
  CHECK(g_json->find("\"layer_norm_epsilon\":1e-06") != std::string::npos);
  auto g_back = ConfigFromHfJson(*g_json);
  REQUIRE_OK(g_back.status());
  CHECK(g_back->NormEps() == 1e-6);
  CHECK(CheckHfConfig(*g_json, Gpt()).message() ==
        "config.json: layer_norm_epsilon 1e-06; the job's model.block.norm_eps is 1e-05");
  auto gpt = HfConfigJson(Gpt());
  REQUIRE_OK(gpt.status());
  CHECK(CheckHfConfig(*gpt, c).message() == "config.json: model_type \"gpt2\"; the job's model needs \"llama\"");
  CHECK_THAT(std::string(CheckHfConfig(R"({"model_type": "llama", "rope_scaling": {"factor": 4}})", c).message()),
             Catch::Matchers::StartsWith("config.json: rope_scaling"));
  CHECK(CheckHfConfig(R"({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})", c)
            .message() == "config.json: rope_theta 10000; the job's model.block.rope_base is 500000");
  // GPT-2 and T5: the model type and head count, as before.
  CHECK(CheckHfConfig(*json, Gpt()).message() == "config.json: model_type \"llama\"; the job's model needs \"gpt2\"");
  GptConfig heads = T5(MlpKind::kRelu, true);
  heads.heads = 4;
  auto t5 = HfConfigJson(heads);
  REQUIRE_OK(t5.status());
  CHECK(CheckHfConfig(*t5, T5(MlpKind::kRelu, true)).message() == "config.json: num_heads 4; the job's model.heads is 2");
}

}  // namespace
}  // namespace dynapipe::runtime::model
