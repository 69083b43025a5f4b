#include "runtime/model/gpt.h"

#include <cmath>
#include <cstring>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "runtime/backend/cpu/ops.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cpu = ::dynapipe::runtime::cpu;

absl::StatusOr<GptConfig> GptConfig::FromSpec(const proto::ModelSpec& spec) {
  if (spec.kind() != proto::ModelKind::gpt) {
    return absl::InvalidArgumentError(absl::StrCat("model.kind: ", proto::ModelKind::Value_Name(spec.kind()),
                                                   " is not supported by the executor (gpt only)"));
  }
  GptConfig c;
  c.num_layers = spec.num_layers();
  c.hidden = spec.hidden();
  c.heads = spec.heads();
  c.ffn = spec.ffn() > 0 ? spec.ffn() : 4 * spec.hidden();
  c.vocab = spec.vocab();
  c.max_positions = spec.max_positions();
  c.tie_embeddings = spec.tie_embeddings();
  c.attention = spec.attention() == proto::AttentionKernel::materialized ? cpu::AttentionKernel::kMaterialized
                                                                         : cpu::AttentionKernel::kVarlen;
  auto positive = [](int v, const char* field) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be positive, got ", v));
  };
  RETURN_IF_ERROR(positive(c.num_layers, "num_layers"));
  RETURN_IF_ERROR(positive(c.hidden, "hidden"));
  RETURN_IF_ERROR(positive(c.heads, "heads"));
  RETURN_IF_ERROR(positive(c.vocab, "vocab"));
  RETURN_IF_ERROR(positive(c.max_positions, "max_positions"));
  if (c.hidden % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", c.heads, " does not divide model.hidden ", c.hidden));
  }
  return c;
}

float InitNormal(uint64_t seed, const std::string& name, uint64_t index, float std) {
  // FNV-1a of the name, then splitmix64 of (seed, name, index): stable across
  // processes, builds and stage splits.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ULL;
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const uint64_t base = mix(seed ^ mix(h)) + 2 * index;
  const double u1 = (static_cast<double>(mix(base) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(mix(base + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

// What backward needs from one micro-batch's forward.
struct GptStage::Stash {
  struct LayerActs {
    Buffer x;  // layer input (N, C)
    Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, att, x2, ln2, ln2_mean, ln2_rstd, fc, gelu;
  };
  int64_t rows = 0, seq = 0;
  std::vector<int32_t> tokens, positions, segments;
  std::vector<LayerActs> layers;
  // Last stage: only scored positions go through the head.
  std::vector<int64_t> scored;  // token index of each scored row
  std::vector<int32_t> targets;
  Buffer xs, lnf, lnf_mean, lnf_rstd, probs;  // (M, C), (M, C), (M), (M), (M, V)
  float loss_scale = 0;
};

absl::StatusOr<std::unique_ptr<GptStage>> GptStage::Create(const GptConfig& config, const Options& options,
                                                           BufferPool* pool) {
  if (options.num_layers < 0 || options.first_layer < 0 ||
      options.first_layer + options.num_layers > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("stage layers [", options.first_layer, ", ",
                                                   options.first_layer + options.num_layers,
                                                   ") are outside the model's ", config.num_layers, " layers"));
  }
  if (options.first != (options.first_layer == 0) || options.last != (options.first_layer + options.num_layers ==
                                                                       config.num_layers)) {
    return absl::InvalidArgumentError("stage: first/last flags disagree with its layer range");
  }
  std::unique_ptr<GptStage> stage(new GptStage(config, options, pool));
  stage->Build();
  return stage;
}

GptStage::GptStage(const GptConfig& c, const Options& o, BufferPool* pool) : config_(c), options_(o), pool_(pool) {}
GptStage::~GptStage() = default;

size_t GptStage::Add(const std::string& name, std::vector<int64_t> shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  const size_t offset = params_.empty() ? 0 : params_.back().offset + params_.back().size;
  params_.push_back(ParamInfo{name, std::move(shape), offset, n});
  return offset;
}

void GptStage::Build() {
  const int64_t C = config_.hidden, F = config_.ffn, V = config_.vocab, NP = config_.max_positions;
  const bool head_uses_wte = options_.last && config_.tie_embeddings;
  if (options_.first || head_uses_wte) wte_ = Add("wte", {V, C});
  if (options_.first) wpe_ = Add("wpe", {NP, C});
  for (int i = 0; i < options_.num_layers; ++i) {
    const std::string p = absl::StrCat("h.", options_.first_layer + i, ".");
    Layer l;
    l.ln1_w = Add(p + "ln1.w", {C});
    l.ln1_b = Add(p + "ln1.b", {C});
    l.qkv_w = Add(p + "attn.qkv.w", {3 * C, C});
    l.qkv_b = Add(p + "attn.qkv.b", {3 * C});
    l.proj_w = Add(p + "attn.proj.w", {C, C});
    l.proj_b = Add(p + "attn.proj.b", {C});
    l.ln2_w = Add(p + "ln2.w", {C});
    l.ln2_b = Add(p + "ln2.b", {C});
    l.fc_w = Add(p + "mlp.fc.w", {F, C});
    l.fc_b = Add(p + "mlp.fc.b", {F});
    l.mproj_w = Add(p + "mlp.proj.w", {C, F});
    l.mproj_b = Add(p + "mlp.proj.b", {C});
    layers_.push_back(l);
  }
  if (options_.last) {
    lnf_w_ = Add("lnf.w", {C});
    lnf_b_ = Add("lnf.b", {C});
    head_ = head_uses_wte ? wte_ : Add("lm_head.w", {V, C});
  }
  const size_t total = params_.empty() ? 0 : params_.back().offset + params_.back().size;
  params_data_.assign(total, 0.0f);
  grads_data_.assign(total, 0.0f);
  // GPT-2 initialisation; residual projections scaled by depth.
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.num_layers));
  for (const ParamInfo& p : params_) {
    float* w = P(p.offset);
    const std::string_view n = p.name;
    if (n.ends_with("ln1.w") || n.ends_with("ln2.w") || n == "lnf.w") {
      std::fill(w, w + p.size, 1.0f);
    } else if (n.ends_with(".b")) {
      std::fill(w, w + p.size, 0.0f);
    } else {
      const float std = n.ends_with("proj.w") ? residual_std : 0.02f;
      for (size_t i = 0; i < p.size; ++i) w[i] = InitNormal(options_.seed, p.name, i, std);
    }
  }
}

const ParamInfo* GptStage::FindParam(const std::string& name) const {
  for (const ParamInfo& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

void GptStage::ZeroGrads() { std::fill(grads_data_.begin(), grads_data_.end(), 0.0f); }

bool GptStage::HasSharedEmbedding() const {
  return config_.tie_embeddings && options_.first != options_.last;
}

absl::Status CheckTokenBatch(const TokenBatch& b, const GptConfig& c) {
  const size_t n = static_cast<size_t>(b.rows * b.seq);
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
  return absl::OkStatus();
}

absl::StatusOr<double> GptStage::Forward(int mb, const TokenBatch& batch, const float* hidden_in, float* hidden_out,
                                         float loss_scale) {
  if (stash_.contains(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " forwarded twice"));
  RETURN_IF_ERROR(CheckTokenBatch(batch, config_));
  if (!options_.first && hidden_in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (!options_.last && hidden_out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  const int64_t B = batch.rows, T = batch.seq, N = B * T, C = config_.hidden, F = config_.ffn,
                V = config_.vocab, NH = config_.heads;
  auto s = std::make_unique<Stash>();
  s->rows = B;
  s->seq = T;
  s->segments = batch.segments;
  if (options_.first) {
    s->tokens = batch.tokens;
    s->positions = batch.positions;
  }
  s->loss_scale = loss_scale;
  auto get = [&](int64_t floats) { return pool_->Get(static_cast<size_t>(floats) * sizeof(float)); };

  Buffer x = get(N * C);
  if (options_.first) {
    cpu::EmbeddingForward(x.as<float>(), batch.tokens.data(), batch.positions.data(), P(wte_), P(wpe_), N, C);
  } else {
    std::memcpy(x.data(), hidden_in, N * C * sizeof(float));  // the plan may free its slot after this
  }
  s->layers.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    Stash::LayerActs& a = s->layers[i];
    a.x = std::move(x);
    a.ln1 = get(N * C), a.ln1_mean = get(N), a.ln1_rstd = get(N);
    cpu::LayerNormForward(a.ln1.as<float>(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), a.x.as<float>(),
                          P(l.ln1_w), P(l.ln1_b), N, C);
    a.qkv = get(N * 3 * C);
    cpu::MatmulForward(a.qkv.as<float>(), a.ln1.as<float>(), P(l.qkv_w), P(l.qkv_b), N, C, 3 * C);
    a.atty = get(N * C), a.att = get(B * NH * T * T);
    cpu::AttentionForward(a.atty.as<float>(), a.att.as<float>(), a.qkv.as<float>(), batch.segments.data(), B, T, C,
                          NH, config_.attention);
    a.x2 = get(N * C);
    float* x2 = a.x2.as<float>();
    cpu::MatmulForward(x2, a.atty.as<float>(), P(l.proj_w), P(l.proj_b), N, C, C);
    const float* xin = a.x.as<float>();
    for (int64_t k = 0; k < N * C; ++k) x2[k] += xin[k];
    a.ln2 = get(N * C), a.ln2_mean = get(N), a.ln2_rstd = get(N);
    cpu::LayerNormForward(a.ln2.as<float>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(), x2, P(l.ln2_w),
                          P(l.ln2_b), N, C);
    a.fc = get(N * F), a.gelu = get(N * F);
    cpu::MatmulForward(a.fc.as<float>(), a.ln2.as<float>(), P(l.fc_w), P(l.fc_b), N, C, F);
    cpu::GeluForward(a.gelu.as<float>(), a.fc.as<float>(), N * F);
    // The layer's output goes straight to the stage output when nothing
    // follows on this stage but a send.
    const bool to_output = i + 1 == layers_.size() && !options_.last;
    Buffer next;
    float* out;
    if (to_output) {
      out = hidden_out;
    } else {
      next = get(N * C);
      out = next.as<float>();
    }
    cpu::MatmulForward(out, a.gelu.as<float>(), P(l.mproj_w), P(l.mproj_b), N, F, C);
    for (int64_t k = 0; k < N * C; ++k) out[k] += x2[k];
    x = std::move(next);
  }
  if (layers_.empty() && !options_.last) std::memcpy(hidden_out, x.data(), N * C * sizeof(float));

  double loss = 0;
  if (options_.last) {
    for (int64_t k = 0; k < N; ++k) {
      if (batch.targets[k] >= 0) {
        s->scored.push_back(k);
        s->targets.push_back(batch.targets[k]);
      }
    }
    const int64_t M = static_cast<int64_t>(s->scored.size());
    if (M > 0) {
      s->xs = get(M * C);
      const float* xf = x.as<float>();
      for (int64_t r = 0; r < M; ++r) std::memcpy(s->xs.as<float>() + r * C, xf + s->scored[r] * C, C * sizeof(float));
      s->lnf = get(M * C), s->lnf_mean = get(M), s->lnf_rstd = get(M);
      cpu::LayerNormForward(s->lnf.as<float>(), s->lnf_mean.as<float>(), s->lnf_rstd.as<float>(), s->xs.as<float>(),
                            P(lnf_w_), P(lnf_b_), M, C);
      Buffer logits = get(M * V);
      cpu::MatmulForward(logits.as<float>(), s->lnf.as<float>(), P(head_), static_cast<const float*>(nullptr), M, C,
                         V);
      s->probs = get(M * V);
      loss = cpu::CrossEntropyForward(s->probs.as<float>(), logits.as<float>(), s->targets.data(), loss_scale, M, V);
    }
  }
  stash_[mb] = std::move(s);
  return loss;
}

absl::Status GptStage::Backward(int mb, const float* dhidden_out, float* dhidden_in) {
  auto it = stash_.find(mb);
  if (it == stash_.end()) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " was not forwarded"));
  if (!options_.last && dhidden_out == nullptr) return absl::InvalidArgumentError("output gradient: missing");
  if (!options_.first && dhidden_in == nullptr) return absl::InvalidArgumentError("input gradient: missing");
  std::unique_ptr<Stash> s = std::move(it->second);
  stash_.erase(it);
  const int64_t B = s->rows, T = s->seq, N = B * T, C = config_.hidden, F = config_.ffn, V = config_.vocab,
                NH = config_.heads;
  auto get = [&](int64_t floats) { return pool_->Get(static_cast<size_t>(floats) * sizeof(float)); };
  auto zero = [](Buffer& b) { std::memset(b.data(), 0, b.bytes()); };

  // Gradient of the residual stream, accumulated layer by layer downwards.
  Buffer dres = get(N * C);
  if (options_.last) {
    zero(dres);
    const int64_t M = static_cast<int64_t>(s->scored.size());
    if (M > 0) {
      Buffer dlogits = get(M * V);
      zero(dlogits);
      cpu::CrossEntropyBackward(dlogits.as<float>(), s->probs.as<float>(), s->targets.data(), s->loss_scale, M, V);
      s->probs.Release();
      Buffer dlnf = get(M * C), dxs = get(M * C);
      zero(dlnf);
      zero(dxs);
      cpu::MatmulBackward(dlnf.as<float>(), G(head_), static_cast<float*>(nullptr), dlogits.as<const float>(),
                          s->lnf.as<const float>(), P(head_), M, C, V);
      cpu::LayerNormBackward(dxs.as<float>(), G(lnf_w_), G(lnf_b_), dlnf.as<const float>(), s->xs.as<const float>(),
                             P(lnf_w_), s->lnf_mean.as<const float>(), s->lnf_rstd.as<const float>(), M, C);
      for (int64_t r = 0; r < M; ++r) {
        std::memcpy(dres.as<float>() + s->scored[r] * C, dxs.as<float>() + r * C, C * sizeof(float));
      }
    }
  } else {
    std::memcpy(dres.data(), dhidden_out, N * C * sizeof(float));
  }
  Buffer dF1 = get(N * F), dF2 = get(N * F), dln = get(N * C), datty = get(N * C), dqkv = get(N * 3 * C);
  float* dr = dres.as<float>();
  for (size_t i = layers_.size(); i-- > 0;) {
    const Layer& l = layers_[i];
    Stash::LayerActs& a = s->layers[i];
    // MLP branch.
    zero(dF1);
    cpu::MatmulBackward(dF1.as<float>(), G(l.mproj_w), G(l.mproj_b), dr, a.gelu.as<const float>(), P(l.mproj_w), N,
                        F, C);
    zero(dF2);
    cpu::GeluBackward(dF2.as<float>(), a.fc.as<const float>(), dF1.as<const float>(), N * F);
    zero(dln);
    cpu::MatmulBackward(dln.as<float>(), G(l.fc_w), G(l.fc_b), dF2.as<const float>(), a.ln2.as<const float>(),
                        P(l.fc_w), N, C, F);
    cpu::LayerNormBackward(dr, G(l.ln2_w), G(l.ln2_b), dln.as<const float>(), a.x2.as<const float>(), P(l.ln2_w),
                           a.ln2_mean.as<const float>(), a.ln2_rstd.as<const float>(), N, C);
    // Attention branch.
    zero(datty);
    cpu::MatmulBackward(datty.as<float>(), G(l.proj_w), G(l.proj_b), dr, a.atty.as<const float>(), P(l.proj_w), N, C,
                        C);
    zero(dqkv);
    cpu::AttentionBackward(dqkv.as<float>(), datty.as<const float>(), a.qkv.as<const float>(), a.att.as<const float>(),
                           s->segments.data(), B, T, C, NH, config_.attention);
    zero(dln);
    cpu::MatmulBackward(dln.as<float>(), G(l.qkv_w), G(l.qkv_b), dqkv.as<const float>(), a.ln1.as<const float>(),
                        P(l.qkv_w), N, C, 3 * C);
    cpu::LayerNormBackward(dr, G(l.ln1_w), G(l.ln1_b), dln.as<const float>(), a.x.as<const float>(), P(l.ln1_w),
                           a.ln1_mean.as<const float>(), a.ln1_rstd.as<const float>(), N, C);
    a = Stash::LayerActs{};  // release this layer's activations early
  }
  if (options_.first) {
    cpu::EmbeddingBackward(G(wte_), G(wpe_), dr, s->tokens.data(), s->positions.data(), N, C);
  } else {
    std::memcpy(dhidden_in, dr, N * C * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status GptStage::Infer(const TokenBatch& batch, const float* hidden_in, float* out) {
  // Run the training forward on a private key, then drop the stash; the last
  // stage computes the head for every position by scoring them all.
  constexpr int kInferKey = -1;
  const int64_t N = batch.rows * batch.seq, C = config_.hidden, V = config_.vocab;
  if (!options_.last) {
    RETURN_IF_ERROR(Forward(kInferKey, batch, hidden_in, out, 0.0f).status());
    stash_.erase(kInferKey);
    return absl::OkStatus();
  }
  TokenBatch all = batch;
  for (int64_t k = 0; k < N; ++k) all.targets[k] = std::max(all.targets[k], 0);
  RETURN_IF_ERROR(Forward(kInferKey, all, hidden_in, nullptr, 0.0f).status());
  const Stash& s = *stash_.at(kInferKey);
  cpu::MatmulForward(out, s.lnf.as<const float>(), P(head_), static_cast<const float*>(nullptr), N, C, V);
  stash_.erase(kInferKey);
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::model
