#include "runtime/model/layout.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "src/common/keyed_normal.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

size_t DTypeBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
const char* DTypeName(DType dtype) { return dtype == DType::kF32 ? "fp32" : "bf16"; }

absl::StatusOr<GptConfig> GptConfig::FromSpec(const proto::ModelSpec& spec) {
  if (spec.kind() != proto::ModelKind::gpt && spec.kind() != proto::ModelKind::t5 &&
      spec.kind() != proto::ModelKind::llama) {
    return absl::InvalidArgumentError(absl::StrCat("model.kind: ", proto::ModelKind::Value_Name(spec.kind()),
                                                   " is not supported by the executor (gpt, t5 and llama)"));
  }
  GptConfig c;
  c.encoder_decoder = spec.kind() == proto::ModelKind::t5;
  c.decoder_layers = c.encoder_decoder ? spec.num_decoder_layers() : 0;
  c.num_layers = spec.num_layers();
  c.hidden = spec.hidden();
  c.heads = spec.heads();
  c.ffn = spec.ffn();  // a normalised spec (spec::NormalizeJobSpec) has it written out
  c.vocab = spec.vocab();
  c.max_positions = spec.max_positions();
  c.tie_embeddings = spec.tie_embeddings();
  c.attention = spec.attention() == proto::AttentionKernel::materialized ? AttentionKernel::kMaterialized
                                                                         : AttentionKernel::kVarlen;
  // A normalised spec has the block written out; unspecified reads as GPT-2's.
  c.norm = spec.block().norm() == proto::NormKind::rmsnorm ? NormKind::kRms : NormKind::kLayerNorm;
  switch (spec.block().mlp()) {
    case proto::MlpKind::relu: c.mlp = MlpKind::kRelu; break;
    case proto::MlpKind::gated_gelu: c.mlp = MlpKind::kGatedGelu; break;
    case proto::MlpKind::swiglu: c.mlp = MlpKind::kSwiglu; break;
    default: c.mlp = MlpKind::kGelu; break;
  }
  c.bias = spec.block().has_bias() ? spec.block().bias() : true;
  // norm_eps and rope_base: a normalised spec has them written out; 0 or
  // absent reads as the default of the norm (GptConfig::NormEps).
  c.norm_eps = spec.block().norm_eps();
  c.kv_heads = spec.kv_heads() > 0 ? spec.kv_heads() : spec.heads();
  c.rotary = spec.block().positions() == proto::PositionKind::rotary;
  if (spec.kind() == proto::ModelKind::llama && !c.rotary) {  // a spec not normalised reads as GPT-2's block
    return absl::InvalidArgumentError("model.block.positions: a llama model needs rotary positions");
  }
  if (spec.block().rope_base() > 0) c.rope_base = static_cast<float>(spec.block().rope_base());
  auto positive = [](int v, const char* field) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be positive, got ", v));
  };
  RETURN_IF_ERROR(positive(c.num_layers, "num_layers"));
  RETURN_IF_ERROR(positive(c.hidden, "hidden"));
  RETURN_IF_ERROR(positive(c.heads, "heads"));
  RETURN_IF_ERROR(positive(c.ffn, "ffn"));
  RETURN_IF_ERROR(positive(c.vocab, "vocab"));
  RETURN_IF_ERROR(positive(c.max_positions, "max_positions"));
  if (c.encoder_decoder) {
    RETURN_IF_ERROR(positive(c.decoder_layers, "num_decoder_layers"));
    if (c.bias) return absl::InvalidArgumentError("model.block.bias: T5 stages have no biases");
  }
  if (c.hidden % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", c.heads, " does not divide model.hidden ", c.hidden));
  }
  if (c.kv_heads <= 0 || c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.kv_heads: ", c.kv_heads, " does not divide model.heads ", c.heads));
  }
  if (c.encoder_decoder && (c.rotary || c.kv_heads != c.heads)) {
    return absl::InvalidArgumentError("model: T5 stages have neither rotary positions nor grouped-query attention");
  }
  if (c.rotary && c.HeadSize() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.block.positions: rotary needs an even head size, got ", c.HeadSize()));
  }
  return c;
}

namespace {

// Whether every sample (segment id >= 0) of each row of `seg` (rows x len)
// is one contiguous run, as batching places them: the kernels of both
// backends find a sample's tokens differently (the CPU's by its runs, the
// CUDA cross-attention's by its id), so they agree only on such rows.
absl::Status ContiguousSamples(const std::vector<int32_t>& seg, int64_t rows, int64_t len, const char* what) {
  absl::flat_hash_set<int32_t> done;
  for (int64_t r = 0; r < rows; ++r) {
    done.clear();
    const int32_t* row = seg.data() + r * len;
    for (int64_t t = 0; t < len; ++t) {
      if (row[t] < 0 || (t > 0 && row[t] == row[t - 1])) continue;
      if (!done.insert(row[t]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("micro-batch ", what, " row ", r, ": sample ", row[t], " is split into several runs"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTokenBatch(const TokenBatch& b, const GptConfig& c) {
  const size_t n = static_cast<size_t>(b.rows * b.seq);
  if (c.encoder_decoder) {
    const size_t ne = static_cast<size_t>(b.rows * b.enc_seq);
    if (b.enc_seq <= 0 || b.enc_tokens.size() != ne || b.enc_segments.size() != ne) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batch encoder tensors do not match its shape ", b.rows, "x", b.enc_seq));
    }
    for (const int32_t t : b.enc_tokens) {
      if (t < 0 || t >= c.vocab) return absl::InvalidArgumentError(absl::StrCat("token id outside the vocabulary of ", c.vocab));
    }
    RETURN_IF_ERROR(ContiguousSamples(b.enc_segments, b.rows, b.enc_seq, "encoder"));
  }
  if (b.rows <= 0 || b.seq <= 0 || b.tokens.size() != n || b.positions.size() != n || b.segments.size() != n ||
      b.targets.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch tensors do not match its shape ", b.rows, "x", b.seq));
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= c.vocab || b.targets[i] >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id outside the vocabulary of ", c.vocab));
    }
    if (b.positions[i] < 0 || b.positions[i] >= c.max_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", b.positions[i], " outside the model's ", c.max_positions, " positions"));
    }
  }
  return ContiguousSamples(b.segments, b.rows, b.seq, "tokens");
}

namespace {

// Values drawn per task; below a few tasks' worth, one thread does it all.
constexpr size_t kInitChunk = size_t{1} << 20;

}  // namespace

bool IsEncoderDecoderShared(std::string_view name) {
  for (const char* shared : kEncoderDecoderShared) {
    if (name == shared) return true;
  }
  return false;
}

uint64_t InitKey(uint64_t seed, const std::string& name) {
  return keyed_normal::StreamKey(seed, name.data(), name.size());
}

float InitNormal(uint64_t seed, const std::string& name, uint64_t index, float std) {
  // Stable across processes, builds, stage splits and backends.
  return keyed_normal::Normal(InitKey(seed, name), index, std);
}

absl::StatusOr<GptLayout> GptLayout::Make(const GptConfig& config, const StageOptions& options) {
  const int total = config.TotalLayers();
  if (options.num_layers < 0 || options.first_layer < 0 || options.first_layer + options.num_layers > total) {
    return absl::InvalidArgumentError(absl::StrCat("stage layers [", options.first_layer, ", ",
                                                   options.first_layer + options.num_layers,
                                                   ") are outside the model's ", total, " layers"));
  }
  if (options.first != (options.first_layer == 0) ||
      options.last != (options.first_layer + options.num_layers == total)) {
    return absl::InvalidArgumentError("stage: first/last flags disagree with its layer range");
  }
  // A config built directly, not through FromSpec, is checked too.
  if (config.heads <= 0 || config.hidden % config.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.heads: ", config.heads, " does not divide model.hidden ", config.hidden));
  }
  if (config.heads % config.KvHeads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.kv_heads: ", config.KvHeads(), " does not divide model.heads ", config.heads));
  }
  if (config.rotary && config.HeadSize() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.block.positions: rotary needs an even head size, got ", config.HeadSize()));
  }
  GptLayout l(config, options);
  if (config.encoder_decoder) {
    // T5's buckets: half for each direction in the encoder, half of those
    // exact distances (so at least 4), the logarithmic ones reaching out to
    // max_distance beyond the exact ones; otherwise the bucket of a distance
    // is undefined (0 / 0 in its logarithm) and indexes outside the table.
    if (config.relative_buckets < 4 || config.relative_max_distance <= config.relative_buckets / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: relative position buckets ", config.relative_buckets, " with max distance ",
          config.relative_max_distance, ": needs at least 4 buckets and a max distance above half of them"));
    }
    l.AddEncoderDecoder();
    return l;
  }
  const int64_t C = config.hidden, F = config.ffn, W = config.MlpWidth(), V = config.vocab, NP = config.max_positions;
  const bool head_uses_wte = options.last && config.tie_embeddings;
  // Biases (and LayerNorm's shift) only where the block has them.
  auto bias = [&](const std::string& name, int64_t n) { return config.bias ? l.Add(name, {n}) : kAbsent; };
  auto norm_bias = [&](const std::string& name) { return config.NormBias() ? l.Add(name, {C}) : kAbsent; };
  if (options.first || head_uses_wte) l.wte_ = l.Add("wte", {V, C});
  if (options.first && !config.rotary) l.wpe_ = l.Add("wpe", {NP, C});
  if (config.rotary) l.wpe_ = kAbsent;
  const int64_t QKV = config.QkvWidth();
  for (int i = 0; i < options.num_layers; ++i) {
    const std::string p = absl::StrCat("h.", options.first_layer + i, ".");
    Layer y;
    y.ln1_w = l.Add(p + "ln1.w", {C});
    y.ln1_b = norm_bias(p + "ln1.b");
    y.qkv_w = l.Add(p + "attn.qkv.w", {QKV, C});  // [q | k | v] rows
    y.qkv_b = bias(p + "attn.qkv.b", QKV);
    y.proj_w = l.Add(p + "attn.proj.w", {C, C});
    y.proj_b = bias(p + "attn.proj.b", C);
    y.ln2_w = l.Add(p + "ln2.w", {C});
    y.ln2_b = norm_bias(p + "ln2.b");
    y.fc_w = l.Add(p + "mlp.fc.w", {W, C});  // gated: the gate's F rows, then the up projection's
    y.fc_b = bias(p + "mlp.fc.b", W);
    y.mproj_w = l.Add(p + "mlp.proj.w", {C, F});
    y.mproj_b = bias(p + "mlp.proj.b", C);
    l.layers_.push_back(y);
  }
  if (options.last) {
    l.lnf_w_ = l.Add("lnf.w", {C});
    l.lnf_b_ = norm_bias("lnf.b");
    l.head_ = head_uses_wte ? l.wte_ : l.Add("lm_head.w", {V, C});
  }
  return l;
}

size_t GptLayout::Add(const std::string& name, std::vector<int64_t> shape, bool in_norm) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  const size_t offset = num_params_;
  ParamInfo p{name, std::move(shape), offset, n};
  // Matrices decay; the relative position bias tables, like gains, do not.
  p.decay = p.shape.size() >= 2 && !name.ends_with("rel_bias");
  // The last stage's copy of a tied embedding is the same parameter as the
  // first stage's: counted there.
  p.in_norm = in_norm && !(name == "wte" && HasSharedEmbedding() && !options_.first);
  params_.push_back(std::move(p));
  num_params_ += n;
  return offset;
}

const ParamInfo* GptLayout::FindParam(const std::string& name) const {
  for (const ParamInfo& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// An encoder-decoder stage: wte where it embeds (the encoder's first layer,
// the decoder's first layer) or heads with a tied embedding; a stack's bias
// table with any of its layers; enc.lnf after the encoder's last layer. A
// tensor several stages hold counts in the gradient norm on the one holding
// its stack's first layer (wte: the first stage).
void GptLayout::AddEncoderDecoder() {
  const GptConfig& c = config_;
  const int E = c.num_layers, lo = options_.first_layer, hi = lo + options_.num_layers;
  const int64_t C = c.hidden, F = c.ffn, W = c.MlpWidth(), V = c.vocab, NH = c.heads, NB = c.relative_buckets;
  const bool embeds_decoder = lo <= E && E < hi;
  wpe_ = kAbsent;
  if (options_.first || embeds_decoder || (options_.last && c.tie_embeddings)) wte_ = Add("wte", {V, C}, options_.first);
  if (lo < E) enc_rel_ = Add("enc.rel_bias", {NB, NH}, lo == 0);
  for (int i = lo; i < hi; ++i) {
    const bool dec = i >= E;
    if (dec && (i == lo || i == E)) dec_rel_ = Add("dec.rel_bias", {NB, NH}, i == E);
    const std::string p = dec ? absl::StrCat("dec.", i - E, ".") : absl::StrCat("enc.", i, ".");
    Layer y{};
    y.ln1_b = y.qkv_b = y.proj_b = y.ln2_b = y.fc_b = y.mproj_b = kAbsent;
    y.ln1_w = Add(p + "ln1.w", {C});
    y.qkv_w = Add(p + "attn.qkv.w", {3 * C, C});
    y.proj_w = Add(p + "attn.proj.w", {C, C});
    if (dec) {
      y.decoder = true;
      y.ln3_w = Add(p + "ln3.w", {C});
      y.xq_w = Add(p + "xattn.q.w", {C, C});
      y.xkv_w = Add(p + "xattn.kv.w", {2 * C, C});
      y.xproj_w = Add(p + "xattn.proj.w", {C, C});
    }
    y.ln2_w = Add(p + "ln2.w", {C});
    y.fc_w = Add(p + "mlp.fc.w", {W, C});
    y.mproj_w = Add(p + "mlp.proj.w", {C, F});
    layers_.push_back(y);
    if (i == E - 1) enc_lnf_w_ = Add("enc.lnf.w", {C});
  }
  lnf_b_ = kAbsent;
  if (options_.last) {
    lnf_w_ = Add("lnf.w", {C});
    head_ = c.tie_embeddings ? wte_ : Add("lm_head.w", {V, C});
  }
}

namespace {

template <typename Pred>
std::vector<ParamRun> Runs(const std::vector<ParamInfo>& params, Pred pred) {
  std::vector<ParamRun> out;
  for (const ParamInfo& p : params) {
    if (!pred(p) || p.size == 0) continue;
    if (!out.empty() && out.back().offset + out.back().size == p.offset) {
      out.back().size += p.size;
    } else {
      out.push_back({p.offset, p.size});
    }
  }
  return out;
}

}  // namespace

std::vector<ParamRun> GptLayout::DecayRuns(bool want) const {
  return Runs(params_, [want](const ParamInfo& p) { return p.decay == want; });
}

std::vector<ParamRun> GptLayout::NormRuns() const {
  return Runs(params_, [](const ParamInfo& p) { return p.in_norm; });
}

std::vector<InitRule> GptLayout::InitRules() const {
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.TotalLayers()));
  std::vector<InitRule> rules;
  rules.reserve(params_.size());
  for (const ParamInfo& p : params_) {
    InitRule r;
    r.offset = p.offset;
    r.size = p.size;
    const std::string_view n = p.name;
    if (n.ends_with("ln1.w") || n.ends_with("ln2.w") || n.ends_with("ln3.w") || n.ends_with("lnf.w")) {
      r.value = 1.0f;
    } else if (n.ends_with(".b")) {
      r.value = 0.0f;
    } else {
      r.normal = true;
      r.std = n.ends_with("proj.w") ? residual_std : 0.02f;
      r.key = InitKey(options_.seed, p.name);
    }
    rules.push_back(r);
  }
  return rules;
}

void GptLayout::Initialize(std::span<float> out, int threads) const {
  // Random tensors are cut into chunks of kInitChunk values; every value
  // depends only on (seed, name, index), so any split gives the same bits.
  struct Task {
    float* w;
    uint64_t key;
    size_t begin, end;
    float std;
  };
  std::vector<Task> tasks;
  for (const InitRule& r : InitRules()) {
    float* w = out.data() + r.offset;
    if (!r.normal) {
      std::fill(w, w + r.size, r.value);
      continue;
    }
    for (size_t b = 0; b < r.size; b += kInitChunk) tasks.push_back({w, r.key, b, std::min(r.size, b + kInitChunk), r.std});
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t t = next++; t < tasks.size(); t = next++) {
      const Task& k = tasks[t];
      for (size_t i = k.begin; i < k.end; ++i) k.w[i] = keyed_normal::Normal(k.key, i, k.std);
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), tasks.size() / 4 + 1));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace dynapipe::runtime::model
