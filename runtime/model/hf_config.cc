#include "runtime/model/hf_config.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/struct.pb.h"
#include "src/common/json_writer.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// The field `name` of `f` when present and not null.
const Value* Field(const Struct& f, const std::string& name) {
  auto it = f.fields().find(name);
  if (it == f.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
  return &it->second;
}

// A number field of `f`, or `fallback` when absent or null.
double Num(const Struct& f, const std::string& name, double fallback) {
  const Value* v = Field(f, name);
  return v != nullptr && v->kind_case() == Value::kNumberValue ? v->number_value() : fallback;
}
std::string Str(const Struct& f, const std::string& name, const std::string& fallback) {
  const Value* v = Field(f, name);
  return v != nullptr && v->kind_case() == Value::kStringValue ? v->string_value() : fallback;
}
bool Bool(const Struct& f, const std::string& name, bool fallback) {
  const Value* v = Field(f, name);
  return v != nullptr && v->kind_case() == Value::kBoolValue ? v->bool_value() : fallback;
}

// A count (layers, widths, heads, vocabulary): a whole number in [1, 2^30],
// or `fallback` when absent or null.
absl::StatusOr<int> Count(const Struct& f, const std::string& name, double fallback) {
  const double v = Num(f, name, fallback);
  if (!(v >= 1 && v <= (1 << 30)) || v != std::floor(v)) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", name, ": ", v, " is not a count in [1, 2^30]"));
  }
  return static_cast<int>(v);
}

// `v` in the fewest digits that read back as the same double (JSON's
// exponent form where printf chooses it).
std::string Shortest(double v) {
  for (int digits = 6; digits < 17; ++digits) {
    const std::string s = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

bool Gpt2Block(const GptConfig& c) {
  return c.norm == NormKind::kLayerNorm && c.mlp == MlpKind::kGelu && c.bias && !c.rotary && c.KvHeads() == c.heads;
}
bool T5Block(const GptConfig& c) { return c.norm == NormKind::kRms && !c.bias && c.mlp != MlpKind::kGelu; }
bool LlamaBlock(const GptConfig& c) {
  return c.norm == NormKind::kRms && c.mlp == MlpKind::kSwiglu && !c.bias && c.rotary;
}

// Each family's norm epsilon field in config.json and transformers'
// default where the file leaves it out.
struct EpsField {
  const char* name;
  double fallback;
};
constexpr EpsField kGpt2Eps{"layer_norm_epsilon", 1e-5};
constexpr EpsField kT5Eps{"layer_norm_epsilon", 1e-6};
constexpr EpsField kLlamaEps{"rms_norm_eps", 1e-6};
EpsField EpsOf(HfFamily family) {
  return family == HfFamily::kT5 ? kT5Eps : (family == HfFamily::kLlama ? kLlamaEps : kGpt2Eps);
}
// The file's epsilon (or transformers' default) into c.norm_eps.
absl::Status Eps(const Struct& f, EpsField field, GptConfig* c) {
  c->norm_eps = Num(f, field.name, field.fallback);
  if (!(c->norm_eps > 0 && c->norm_eps < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", field.name, ": must be in (0, 1)"));
  }
  return absl::OkStatus();
}

// transformers 5 keeps RoPE's settings in `rope_parameters` (rope_type,
// rope_theta); earlier versions in `rope_scaling` (null: plain RoPE) and
// `rope_theta`. Null where neither says.
const Struct* RopeParameters(const Struct& f) {
  const Value* v = Field(f, "rope_parameters");
  return v != nullptr && v->kind_case() == Value::kStructValue ? &v->struct_value() : nullptr;
}
const Value* RopeTheta(const Struct& f) {
  const Struct* p = RopeParameters(f);
  const Value* v = p != nullptr ? Field(*p, "rope_theta") : nullptr;
  return v != nullptr ? v : Field(f, "rope_theta");
}

// What a Llama config.json may ask that our block cannot run.
absl::Status LlamaUnsupported(const Struct& f) {
  const std::string act = Str(f, "hidden_act", "silu");
  if (act != "silu" && act != "swish") {  // transformers' two names of x * sigmoid(x)
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_act \"", act, "\": only silu (SwiGLU) runs here"));
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (Bool(f, bias, false)) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", bias, ": true; our Llama block has no biases"));
    }
  }
  if (const Value* s = Field(f, "rope_scaling"); s != nullptr) {
    const bool plain = s->kind_case() == Value::kStructValue &&
                       Str(s->struct_value(), "rope_type", Str(s->struct_value(), "type", "")) == "default";
    if (!plain) return absl::InvalidArgumentError("config.json: rope_scaling: only plain RoPE (null) runs here");
  }
  if (Field(f, "rope_parameters") != nullptr) {
    const Struct* p = RopeParameters(f);
    if (p == nullptr || Str(*p, "rope_type", "default") != "default") {
      return absl::InvalidArgumentError("config.json: rope_parameters: only plain RoPE (rope_type default) runs here");
    }
  }
  if (const Value* t = RopeTheta(f); t != nullptr && t->kind_case() != Value::kNumberValue) {
    return absl::InvalidArgumentError("config.json: rope_theta: not a number");
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> Gpt2FromJson(const Struct& f) {
  if (Str(f, "activation_function", "gelu_new") != "gelu_new") {
    return absl::InvalidArgumentError("config.json: activation_function: only gelu_new (GELU's tanh form) runs here");
  }
  GptConfig c;
  c.tie_embeddings = Bool(f, "tie_word_embeddings", true);
  ASSIGN_OR_RETURN(c.hidden, Count(f, "n_embd", 768));
  ASSIGN_OR_RETURN(c.heads, Count(f, "n_head", 12));
  ASSIGN_OR_RETURN(c.num_layers, Count(f, "n_layer", 12));
  ASSIGN_OR_RETURN(c.max_positions, Count(f, "n_positions", 1024));
  ASSIGN_OR_RETURN(c.vocab, Count(f, "vocab_size", 50257));
  ASSIGN_OR_RETURN(c.ffn, Count(f, "n_inner", 4.0 * c.hidden));
  RETURN_IF_ERROR(Eps(f, kGpt2Eps, &c));
  return c;
}

absl::StatusOr<GptConfig> T5FromJson(const Struct& f) {
  GptConfig c;
  c.tie_embeddings = Bool(f, "tie_word_embeddings", true);
  c.encoder_decoder = true;
  c.norm = NormKind::kRms;
  c.bias = false;
  ASSIGN_OR_RETURN(c.hidden, Count(f, "d_model", 512));
  ASSIGN_OR_RETURN(c.heads, Count(f, "num_heads", 8));
  ASSIGN_OR_RETURN(c.num_layers, Count(f, "num_layers", 6));
  ASSIGN_OR_RETURN(c.decoder_layers, Count(f, "num_decoder_layers", c.num_layers));
  ASSIGN_OR_RETURN(c.ffn, Count(f, "d_ff", 2048));
  ASSIGN_OR_RETURN(c.vocab, Count(f, "vocab_size", 32128));
  ASSIGN_OR_RETURN(c.relative_buckets, Count(f, "relative_attention_num_buckets", 32));
  ASSIGN_OR_RETURN(c.relative_max_distance, Count(f, "relative_attention_max_distance", 128));
  c.max_positions = 1 << 16;  // relative positions: no table bounds the length
  const std::string ff = Str(f, "feed_forward_proj", "relu");
  if (ff == "relu") {
    c.mlp = MlpKind::kRelu;
  } else if (ff == "gated-gelu") {
    c.mlp = MlpKind::kGatedGelu;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("config.json: feed_forward_proj \"", ff, "\": only relu or gated-gelu"));
  }
  if (Num(f, "d_kv", c.hidden / c.heads) * c.heads != c.hidden) {
    return absl::InvalidArgumentError("config.json: d_kv: must be d_model / num_heads here");
  }
  RETURN_IF_ERROR(Eps(f, kT5Eps, &c));
  return c;
}

// LlamaConfig's defaults (Llama 2 7B's shape; rms_norm_eps 1e-6, an untied
// head) for what the file leaves out.
absl::StatusOr<GptConfig> LlamaFromJson(const Struct& f) {
  RETURN_IF_ERROR(LlamaUnsupported(f));
  GptConfig c;
  c.tie_embeddings = Bool(f, "tie_word_embeddings", false);
  c.UseLlamaBlock();
  ASSIGN_OR_RETURN(c.hidden, Count(f, "hidden_size", 4096));
  ASSIGN_OR_RETURN(c.ffn, Count(f, "intermediate_size", 11008));
  ASSIGN_OR_RETURN(c.num_layers, Count(f, "num_hidden_layers", 32));
  ASSIGN_OR_RETURN(c.heads, Count(f, "num_attention_heads", 32));
  ASSIGN_OR_RETURN(c.kv_heads, Count(f, "num_key_value_heads", c.heads));
  ASSIGN_OR_RETURN(c.vocab, Count(f, "vocab_size", 32000));
  ASSIGN_OR_RETURN(c.max_positions, Count(f, "max_position_embeddings", 2048));
  RETURN_IF_ERROR(Eps(f, kLlamaEps, &c));
  const Value* rope_theta = RopeTheta(f);
  const double theta = rope_theta != nullptr ? rope_theta->number_value() : 10000.0;
  c.rope_base = static_cast<float>(theta);
  if (c.hidden % c.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_attention_heads: ", c.heads,
                                                   " does not divide hidden_size ", c.hidden));
  }
  if (c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_key_value_heads: ", c.kv_heads,
                                                   " does not divide num_attention_heads ", c.heads));
  }
  if (Num(f, "head_dim", c.HeadSize()) != c.HeadSize()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: head_dim: ", Num(f, "head_dim", 0),
                                                   "; must be hidden_size / num_attention_heads (", c.HeadSize(), ") here"));
  }
  if (c.HeadSize() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: head_dim: rotary positions need an even head size, got ",
                                                   c.HeadSize()));
  }
  if (!(theta > 1 && theta < 1e12)) return absl::InvalidArgumentError("config.json: rope_theta: must be in (1, 1e12)");
  return c;
}

void LlamaJson(const GptConfig& c, JsonWriter& w) {
  w.Key("architectures").BeginArray().String("LlamaForCausalLM").EndArray();
  w.Str("model_type", "llama").Int("vocab_size", c.vocab).Int("hidden_size", c.hidden);
  w.Int("intermediate_size", c.ffn).Int("num_hidden_layers", c.num_layers).Int("num_attention_heads", c.heads);
  w.Int("num_key_value_heads", c.KvHeads()).Int("head_dim", c.HeadSize());
  w.Int("max_position_embeddings", c.max_positions).Str("hidden_act", "silu");
  // RoPE's settings both ways transformers reads them (before and since 5).
  w.Raw("rms_norm_eps", Shortest(c.NormEps())).Raw("rope_theta", Shortest(c.rope_base)).Key("rope_scaling").Null();
  w.Key("rope_parameters").BeginObject().Str("rope_type", "default").Raw("rope_theta", Shortest(c.rope_base));
  w.EndObject().Bool("attention_bias", false).Bool("mlp_bias", false);
  w.Fixed("attention_dropout", 0.0, 1);
}

// Where `got` (a config.json's number) and `want` (the job's) differ.
bool Differs(double got, double want) { return std::abs(got - want) > 1e-6 * std::abs(want); }

// What a Llama config.json must agree on with the job beyond its heads.
absl::Status CheckLlama(const Struct& f, const GptConfig& c) {
  RETURN_IF_ERROR(LlamaUnsupported(f));
  if (const Value* v = Field(f, "num_key_value_heads"); v != nullptr && v->number_value() != c.KvHeads()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_key_value_heads ", v->number_value(),
                                                   "; the job's model.kv_heads is ", c.KvHeads()));
  }
  if (const Value* v = RopeTheta(f); v != nullptr && Differs(v->number_value(), c.rope_base)) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: rope_theta ", v->number_value(),
                                                   "; the job's model.block.rope_base is ", c.rope_base));
  }
  return absl::OkStatus();
}

}  // namespace

HfFamily FamilyOf(const GptConfig& c) {
  if (c.encoder_decoder) return HfFamily::kT5;
  return c.rotary ? HfFamily::kLlama : HfFamily::kGpt2;
}

const char* HfArchitecture(const GptConfig& c) {
  switch (FamilyOf(c)) {
    case HfFamily::kT5: return "T5ForConditionalGeneration";
    case HfFamily::kLlama: return "LlamaForCausalLM";
    default: return "GPT2LMHeadModel";
  }
}

absl::StatusOr<std::string> HfConfigJson(const GptConfig& c) {
  JsonWriter w;
  w.BeginObject();
  const HfFamily family = FamilyOf(c);
  if (family == HfFamily::kT5) {
    if (!T5Block(c)) {
      return absl::InvalidArgumentError("model.block: not a T5 block (RMS norm, no biases, ReLU or gated GELU)");
    }
    w.Key("architectures").BeginArray().String("T5ForConditionalGeneration").EndArray();
    w.Str("model_type", "t5").Int("vocab_size", c.vocab).Int("d_model", c.hidden).Int("d_kv", c.hidden / c.heads);
    w.Int("d_ff", c.ffn).Int("num_layers", c.num_layers).Int("num_decoder_layers", c.decoder_layers);
    w.Int("num_heads", c.heads).Int("relative_attention_num_buckets", c.relative_buckets);
    w.Int("relative_attention_max_distance", c.relative_max_distance);
    w.Str("feed_forward_proj", c.mlp == MlpKind::kGatedGelu ? "gated-gelu" : "relu");
    w.Raw("layer_norm_epsilon", Shortest(c.NormEps())).Fixed("dropout_rate", 0.0, 1).Bool("is_encoder_decoder", true);
    w.Int("decoder_start_token_id", 0).Int("pad_token_id", 0).Int("eos_token_id", 1);
  } else if (family == HfFamily::kLlama) {
    if (!LlamaBlock(c)) {
      return absl::InvalidArgumentError("model.block: not Llama's block (RMS norm, SwiGLU, no biases, rotary positions)");
    }
    LlamaJson(c, w);
  } else {
    if (!Gpt2Block(c)) {
      return absl::InvalidArgumentError(
          "model.block: not GPT-2's block (LayerNorm with a shift, GELU, biases, learned positions, kv_heads = heads)");
    }
    w.Key("architectures").BeginArray().String("GPT2LMHeadModel").EndArray();
    w.Str("model_type", "gpt2").Int("vocab_size", c.vocab).Int("n_positions", c.max_positions);
    w.Int("n_embd", c.hidden).Int("n_layer", c.num_layers).Int("n_head", c.heads).Int("n_inner", c.ffn);
    w.Str("activation_function", "gelu_new").Raw("layer_norm_epsilon", Shortest(c.NormEps()));
    w.Fixed("resid_pdrop", 0.0, 1).Fixed("embd_pdrop", 0.0, 1).Fixed("attn_pdrop", 0.0, 1);
  }
  w.Bool("tie_word_embeddings", c.tie_embeddings).Str("torch_dtype", "float32");
  w.EndObject();
  return w.Take();
}

absl::StatusOr<GptConfig> ConfigFromHfJson(absl::string_view json) {
  Struct f;
  RETURN_IF_ERROR(ParseJsonProto(json, "config.json", &f));
  const std::string type = Str(f, "model_type", "");
  if (type == "gpt2") return Gpt2FromJson(f);
  if (type == "t5") return T5FromJson(f);
  if (type == "llama") return LlamaFromJson(f);
  return absl::InvalidArgumentError(absl::StrCat("config.json: model_type \"", type, "\": not gpt2, t5 or llama"));
}

absl::Status CheckHfConfig(absl::string_view json, const GptConfig& c) {
  if (json.empty()) return absl::OkStatus();
  Struct f;
  RETURN_IF_ERROR(ParseJsonProto(json, "config.json", &f));
  const HfFamily family = FamilyOf(c);
  const std::string want = family == HfFamily::kT5 ? "t5" : (family == HfFamily::kLlama ? "llama" : "gpt2");
  if (auto it = f.fields().find("model_type"); it != f.fields().end() && it->second.string_value() != want) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: model_type \"", it->second.string_value(),
                                                   "\"; the job's model needs \"", want, "\""));
  }
  const char* heads =
      family == HfFamily::kT5 ? "num_heads" : (family == HfFamily::kLlama ? "num_attention_heads" : "n_head");
  if (const Value* v = Field(f, heads); v != nullptr && v->number_value() != c.heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: ", heads, " ", v->number_value(), "; the job's model.heads is ", c.heads));
  }
  if (family == HfFamily::kLlama) RETURN_IF_ERROR(CheckLlama(f, c));
  // Tied or not: a tied job would never read an untied file's lm_head, and
  // an untied one would miss it in a tied file.
  const bool tied = Bool(f, "tie_word_embeddings", family != HfFamily::kLlama);
  if (tied != c.tie_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: tie_word_embeddings ", tied ? "true" : "false",
                                                   "; the job's model.tie_embeddings is ",
                                                   c.tie_embeddings ? "true" : "false"));
  }
  // The norm's epsilon, transformers' default where the file has none.
  const EpsField eps = EpsOf(family);
  if (const double got = Num(f, eps.name, eps.fallback); Differs(got, c.NormEps())) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", eps.name, " ", got,
                                                   "; the job's model.block.norm_eps is ", c.NormEps()));
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::model
