#include "runtime/model/hf_checkpoint.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/file_util.h"
#include "src/common/json_writer.h"
#include "src/common/status_macros.h"
#include "src/safetensors/safetensors.h"

namespace dynapipe::runtime::model {

namespace {

// Pieces of the layout's tensors, built against their shapes.
class PieceList {
 public:
  explicit PieceList(const GptLayout& whole) : whole_(whole) {}

  // The whole of `ours`, as is (transpose: GPT-2's Conv1D (in, out)).
  absl::Status Whole(const std::string& hf, const std::string& ours, bool transpose = false) {
    const ParamInfo* p = whole_.FindParam(ours);
    if (p == nullptr) return absl::InternalError(absl::StrCat("layout has no ", ours));
    const int64_t rows = p->shape.empty() ? 1 : p->shape[0];
    return Rows(hf, ours, 0, rows, transpose);
  }
  // Rows [row0, row0 + rows) of `ours`.
  absl::Status Rows(const std::string& hf, const std::string& ours, int64_t row0, int64_t rows,
                    bool transpose = false) {
    const ParamInfo* p = whole_.FindParam(ours);
    if (p == nullptr) return absl::InternalError(absl::StrCat("layout has no ", ours));
    HfPiece piece;
    piece.hf = hf;
    piece.ours = ours;
    piece.row0 = row0;
    piece.rows = rows;
    piece.cols = p->shape.size() <= 1 ? 1 : static_cast<int64_t>(p->size) / p->shape[0];
    piece.transpose = transpose;
    if (p->shape.size() <= 1) {
      piece.hf_shape = {rows};
    } else {
      piece.hf_shape = transpose ? std::vector<int64_t>{piece.cols, rows} : std::vector<int64_t>{rows, piece.cols};
    }
    covered_[ours] += rows * piece.cols;
    pieces_.push_back(std::move(piece));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<HfPiece>> Done() {
    for (const ParamInfo& p : whole_.params()) {
      if (covered_[p.name] != static_cast<int64_t>(p.size)) {
        return absl::InternalError(absl::StrCat("Hugging Face mapping covers ", covered_[p.name], " of ", p.size,
                                                " values of ", p.name));
      }
    }
    return std::move(pieces_);
  }

 private:
  const GptLayout& whole_;
  std::vector<HfPiece> pieces_;
  std::map<std::string, int64_t> covered_;
};

absl::StatusOr<std::vector<HfPiece>> Gpt2Pieces(const GptLayout& whole) {
  const GptConfig& c = whole.config();
  if (c.norm != NormKind::kLayerNorm || c.mlp != MlpKind::kGelu || !c.bias || c.KvHeads() != c.heads) {
    return absl::InvalidArgumentError(
        "model.block: GPT2LMHeadModel has LayerNorm with a shift, GELU, biases and a key-value head per head; this "
        "model's block differs");
  }
  PieceList l(whole);
  const std::string t = "transformer.";
  RETURN_IF_ERROR(l.Whole(t + "wte.weight", "wte"));
  RETURN_IF_ERROR(l.Whole(t + "wpe.weight", "wpe"));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string o = absl::StrCat("h.", i, "."), h = absl::StrCat(t, "h.", i, ".");
    RETURN_IF_ERROR(l.Whole(h + "ln_1.weight", o + "ln1.w"));
    RETURN_IF_ERROR(l.Whole(h + "ln_1.bias", o + "ln1.b"));
    RETURN_IF_ERROR(l.Whole(h + "attn.c_attn.weight", o + "attn.qkv.w", /*transpose=*/true));
    RETURN_IF_ERROR(l.Whole(h + "attn.c_attn.bias", o + "attn.qkv.b"));
    RETURN_IF_ERROR(l.Whole(h + "attn.c_proj.weight", o + "attn.proj.w", true));
    RETURN_IF_ERROR(l.Whole(h + "attn.c_proj.bias", o + "attn.proj.b"));
    RETURN_IF_ERROR(l.Whole(h + "ln_2.weight", o + "ln2.w"));
    RETURN_IF_ERROR(l.Whole(h + "ln_2.bias", o + "ln2.b"));
    RETURN_IF_ERROR(l.Whole(h + "mlp.c_fc.weight", o + "mlp.fc.w", true));
    RETURN_IF_ERROR(l.Whole(h + "mlp.c_fc.bias", o + "mlp.fc.b"));
    RETURN_IF_ERROR(l.Whole(h + "mlp.c_proj.weight", o + "mlp.proj.w", true));
    RETURN_IF_ERROR(l.Whole(h + "mlp.c_proj.bias", o + "mlp.proj.b"));
  }
  RETURN_IF_ERROR(l.Whole(t + "ln_f.weight", "lnf.w"));
  RETURN_IF_ERROR(l.Whole(t + "ln_f.bias", "lnf.b"));
  if (!c.tie_embeddings) RETURN_IF_ERROR(l.Whole("lm_head.weight", "lm_head.w"));
  return l.Done();
}

// T5's feed-forward of one block: wi (ReLU) or wi_0 / wi_1 (gated: our gate
// rows, then up rows), then wo.
absl::Status T5Mlp(PieceList& l, const GptConfig& c, const std::string& hf, const std::string& ours) {
  if (c.mlp == MlpKind::kGatedGelu) {
    RETURN_IF_ERROR(l.Rows(hf + "DenseReluDense.wi_0.weight", ours + "mlp.fc.w", 0, c.ffn));
    RETURN_IF_ERROR(l.Rows(hf + "DenseReluDense.wi_1.weight", ours + "mlp.fc.w", c.ffn, c.ffn));
  } else {
    RETURN_IF_ERROR(l.Whole(hf + "DenseReluDense.wi.weight", ours + "mlp.fc.w"));
  }
  return l.Whole(hf + "DenseReluDense.wo.weight", ours + "mlp.proj.w");
}

// q, k, v, o of a T5 attention from our fused [q; k; v] rows (or q and
// [k; v] for cross-attention) and the output projection.
absl::Status T5Attention(PieceList& l, int64_t C, const std::string& hf, const std::string& q_or_qkv,
                         const std::string& kv, const std::string& proj) {
  const bool fused = kv.empty();
  RETURN_IF_ERROR(l.Rows(hf + "q.weight", q_or_qkv, 0, C));
  RETURN_IF_ERROR(l.Rows(hf + "k.weight", fused ? q_or_qkv : kv, fused ? C : 0, C));
  RETURN_IF_ERROR(l.Rows(hf + "v.weight", fused ? q_or_qkv : kv, fused ? 2 * C : C, C));
  return l.Whole(hf + "o.weight", proj);
}

absl::StatusOr<std::vector<HfPiece>> T5Pieces(const GptLayout& whole) {
  const GptConfig& c = whole.config();
  if (c.norm != NormKind::kRms || c.bias || c.mlp == MlpKind::kGelu) {
    return absl::InvalidArgumentError(
        "model.block: T5ForConditionalGeneration has RMS norm, no biases and a ReLU or gated-GELU feed-forward");
  }
  PieceList l(whole);
  RETURN_IF_ERROR(l.Whole("shared.weight", "wte"));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string o = absl::StrCat("enc.", i, "."), h = absl::StrCat("encoder.block.", i, ".");
    RETURN_IF_ERROR(T5Attention(l, c.hidden, h + "layer.0.SelfAttention.", o + "attn.qkv.w", "", o + "attn.proj.w"));
    if (i == 0) RETURN_IF_ERROR(l.Whole(h + "layer.0.SelfAttention.relative_attention_bias.weight", "enc.rel_bias"));
    RETURN_IF_ERROR(l.Whole(h + "layer.0.layer_norm.weight", o + "ln1.w"));
    RETURN_IF_ERROR(T5Mlp(l, c, h + "layer.1.", o));
    RETURN_IF_ERROR(l.Whole(h + "layer.1.layer_norm.weight", o + "ln2.w"));
  }
  RETURN_IF_ERROR(l.Whole("encoder.final_layer_norm.weight", "enc.lnf.w"));
  for (int j = 0; j < c.decoder_layers; ++j) {
    const std::string o = absl::StrCat("dec.", j, "."), h = absl::StrCat("decoder.block.", j, ".");
    RETURN_IF_ERROR(T5Attention(l, c.hidden, h + "layer.0.SelfAttention.", o + "attn.qkv.w", "", o + "attn.proj.w"));
    if (j == 0) RETURN_IF_ERROR(l.Whole(h + "layer.0.SelfAttention.relative_attention_bias.weight", "dec.rel_bias"));
    RETURN_IF_ERROR(l.Whole(h + "layer.0.layer_norm.weight", o + "ln1.w"));
    RETURN_IF_ERROR(T5Attention(l, c.hidden, h + "layer.1.EncDecAttention.", o + "xattn.q.w", o + "xattn.kv.w",
                                o + "xattn.proj.w"));
    RETURN_IF_ERROR(l.Whole(h + "layer.1.layer_norm.weight", o + "ln3.w"));
    RETURN_IF_ERROR(T5Mlp(l, c, h + "layer.2.", o));
    RETURN_IF_ERROR(l.Whole(h + "layer.2.layer_norm.weight", o + "ln2.w"));
  }
  RETURN_IF_ERROR(l.Whole("decoder.final_layer_norm.weight", "lnf.w"));
  if (!c.tie_embeddings) RETURN_IF_ERROR(l.Whole("lm_head.weight", "lm_head.w"));
  return l.Done();
}

// LlamaForCausalLM: Linear weights (out, in) as ours; q, k and v (kv_heads
// heads each) from our fused [q; k; v] rows, gate and up from our fc rows.
absl::StatusOr<std::vector<HfPiece>> LlamaPieces(const GptLayout& whole) {
  const GptConfig& c = whole.config();
  if (c.norm != NormKind::kRms || c.mlp != MlpKind::kSwiglu || c.bias || !c.rotary) {
    return absl::InvalidArgumentError(
        "model.block: LlamaForCausalLM has RMS norm, SwiGLU, no biases and rotary positions; this model's block differs");
  }
  const int64_t C = c.hidden, KV = static_cast<int64_t>(c.KvHeads()) * c.HeadSize();
  PieceList l(whole);
  RETURN_IF_ERROR(l.Whole("model.embed_tokens.weight", "wte"));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string o = absl::StrCat("h.", i, "."), h = absl::StrCat("model.layers.", i, ".");
    RETURN_IF_ERROR(l.Whole(h + "input_layernorm.weight", o + "ln1.w"));
    RETURN_IF_ERROR(l.Rows(h + "self_attn.q_proj.weight", o + "attn.qkv.w", 0, C));
    RETURN_IF_ERROR(l.Rows(h + "self_attn.k_proj.weight", o + "attn.qkv.w", C, KV));
    RETURN_IF_ERROR(l.Rows(h + "self_attn.v_proj.weight", o + "attn.qkv.w", C + KV, KV));
    RETURN_IF_ERROR(l.Whole(h + "self_attn.o_proj.weight", o + "attn.proj.w"));
    RETURN_IF_ERROR(l.Whole(h + "post_attention_layernorm.weight", o + "ln2.w"));
    RETURN_IF_ERROR(l.Rows(h + "mlp.gate_proj.weight", o + "mlp.fc.w", 0, c.ffn));
    RETURN_IF_ERROR(l.Rows(h + "mlp.up_proj.weight", o + "mlp.fc.w", c.ffn, c.ffn));
    RETURN_IF_ERROR(l.Whole(h + "mlp.down_proj.weight", o + "mlp.proj.w"));
  }
  RETURN_IF_ERROR(l.Whole("model.norm.weight", "lnf.w"));
  if (!c.tie_embeddings) RETURN_IF_ERROR(l.Whole("lm_head.weight", "lm_head.w"));
  return l.Done();
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

}  // namespace

absl::StatusOr<std::vector<HfPiece>> HfPieces(const GptLayout& whole) {
  const StageOptions& o = whole.options();
  if (!o.first || !o.last || o.first_layer != 0 || o.num_layers != whole.config().TotalLayers()) {
    return absl::InvalidArgumentError("Hugging Face checkpoints hold a whole model, not one stage");
  }
  switch (FamilyOf(whole.config())) {
    case HfFamily::kT5: return T5Pieces(whole);
    case HfFamily::kLlama: return LlamaPieces(whole);
    default: return Gpt2Pieces(whole);
  }
}

absl::StatusOr<std::vector<HfTensor>> ToHuggingFace(const GptLayout& whole, std::span<const float> params) {
  if (params.size() != whole.num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.size(), " parameters for a model of ", whole.num_params()));
  }
  ASSIGN_OR_RETURN(const std::vector<HfPiece> pieces, HfPieces(whole));
  std::vector<HfTensor> out;
  out.reserve(pieces.size());
  for (const HfPiece& p : pieces) {
    const float* src = params.data() + whole.FindParam(p.ours)->offset + p.row0 * p.cols;
    HfTensor t{p.hf, p.hf_shape, std::vector<float>(static_cast<size_t>(p.rows * p.cols))};
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t k = 0; k < p.cols; ++k) {
        (p.transpose ? t.data[k * p.rows + r] : t.data[r * p.cols + k]) = src[r * p.cols + k];
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status FromHuggingFace(const GptLayout& dest, const HfSource& source, std::span<float> params) {
  if (params.size() != dest.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(params.size(), " parameters for a layout of ", dest.num_params()));
  }
  const GptConfig& c = dest.config();
  ASSIGN_OR_RETURN(const GptLayout whole, GptLayout::Make(c, {0, c.TotalLayers(), true, true, dest.options().seed}));
  ASSIGN_OR_RETURN(const std::vector<HfPiece> pieces, HfPieces(whole));
  for (const HfPiece& p : pieces) {
    std::string name = p.hf;
    absl::StatusOr<std::vector<int64_t>> shape = source.shape(name);
    for (const absl::string_view base : {"transformer.", "model."}) {  // GPT-2's and Llama's base-model names
      if (!shape.ok() && absl::StartsWith(p.hf, base)) {
        name = p.hf.substr(base.size());
        shape = source.shape(name);
      }
    }
    if (!shape.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor ", p.hf, ": not in the checkpoint"));
    if (*shape != p.hf_shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": shape ", ShapeText(*shape),
                                                     ", the model needs ", ShapeText(p.hf_shape)));
    }
    const ParamInfo* target = dest.FindParam(p.ours);
    if (target == nullptr) continue;  // another stage's: not read
    ASSIGN_OR_RETURN(const std::vector<float> values, source.values(name));
    if (static_cast<int64_t>(values.size()) != Elements(p.hf_shape)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", values.size(), " values"));
    }
    float* dst = params.data() + target->offset + p.row0 * p.cols;
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t k = 0; k < p.cols; ++k) {
        dst[r * p.cols + k] = p.transpose ? values[k * p.rows + r] : values[r * p.cols + k];
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Consecutive runs of tensors of at most `max_bytes` each (a larger tensor
// alone).
std::vector<std::vector<size_t>> Shards(const std::vector<HfTensor>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = tensors[i].data.size() * sizeof(float);
    if (!shards.back().empty() && bytes + b > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += b;
  }
  return shards;
}

}  // namespace

absl::Status WriteHfModel(const std::vector<HfTensor>& tensors, const std::string& config_json, const std::string& dir,
                          uint64_t max_bytes, std::ostream* progress) {
  const std::vector<std::vector<size_t>> shards = Shards(tensors, max_bytes);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};  // what transformers asks of a file
  JsonWriter index;
  uint64_t total = 0;
  index.BeginObject().Key("weight_map").BeginObject();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<safetensors::TensorOut> outs;
    for (size_t i : shards[s]) {
      const HfTensor& t = tensors[i];
      outs.push_back(safetensors::F32Tensor(t.name, t.shape, t.data));
      index.Str(t.name, file);
      total += t.data.size() * sizeof(float);
    }
    RETURN_IF_ERROR(safetensors::Write(dir + "/" + file, outs, metadata));
    if (shards.size() > 1 && progress != nullptr) {
      *progress << absl::StrFormat("  wrote %s (%d of %d)\n", file, s + 1, shards.size());
    }
  }
  index.EndObject().Key("metadata").BeginObject().Int("total_size", static_cast<int64_t>(total)).EndObject();
  index.EndObject();
  if (shards.size() > 1) RETURN_IF_ERROR(WriteFileAtomic(dir + "/model.safetensors.index.json", index.str()));
  return WriteFileAtomic(dir + "/config.json", config_json + "\n");
}

HfSource WeightsSource(const safetensors::WeightSet& weights) {
  return {[&weights](const std::string& name) -> absl::StatusOr<std::vector<int64_t>> {
            const safetensors::TensorInfo* t = weights.Find(name);
            if (t == nullptr) return absl::NotFoundError(name);
            return t->shape;
          },
          [&weights](const std::string& name) { return weights.ReadF32(name); }};
}

}  // namespace dynapipe::runtime::model
