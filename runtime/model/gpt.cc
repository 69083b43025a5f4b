#include "runtime/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cpu/ops.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cpu = ::dynapipe::runtime::cpu;

namespace {

cpu::AttentionKernel CpuKernel(AttentionKernel k) {
  return k == AttentionKernel::kMaterialized ? cpu::AttentionKernel::kMaterialized : cpu::AttentionKernel::kVarlen;
}

// GPT's causal, scaled self-attention, with the model's key-value heads.
cpu::AttentionOptions<float> SelfAttention(const GptConfig& c) {
  cpu::AttentionOptions<float> o;
  o.kv_heads = c.KvHeads();
  return o;
}

// Rotary positions on the queries and keys of rows of [q | k | v]
// (inverse: on their gradients); nothing with learned positions.
void Rotate(const GptConfig& c, float* qkv, const int32_t* positions, int64_t N, bool inverse) {
  if (!c.rotary) return;
  cpu::RotaryApply(qkv, positions, N, c.QkvWidth(), c.heads + c.KvHeads(), c.HeadSize(), c.rope_base, inverse);
}

}  // namespace

// What backward needs from one layer's forward. With Recompute::kFull only
// x survives forward; with kSelective everything but att.
struct GptStage::LayerActs {
  Buffer x;  // layer input (N, C)
  Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, att, x2, ln2, ln2_mean, ln2_rstd, fc, gelu;
};

// What backward needs from one micro-batch's forward.
struct GptStage::Stash {
  int64_t rows = 0, seq = 0;
  std::vector<int32_t> tokens, positions, segments;
  std::vector<LayerActs> layers;
  // Last stage: only scored positions go through the head.
  std::vector<int64_t> scored;  // token index of each scored row
  std::vector<int32_t> targets;
  Buffer xs, lnf, lnf_mean, lnf_rstd, probs;  // (M, C), (M, C), (M), (M), (M, V)
  float loss_scale = 0;
  // Set when the layers ran on the real tokens only: each one's cell in the
  // full (rows x seq) batch, and that batch's cell count.
  std::vector<int64_t> kept;
  int64_t full_cells = 0;
};

absl::StatusOr<std::unique_ptr<GptStage>> GptStage::Create(const GptConfig& config, const StageOptions& options,
                                                           BufferPool* pool) {
  if (pool == nullptr) return absl::InvalidArgumentError("GptStage: pool is null");
  ASSIGN_OR_RETURN(GptLayout layout, GptLayout::Make(config, options));
  return std::unique_ptr<GptStage>(new GptStage(std::move(layout), pool));
}

GptStage::GptStage(GptLayout layout, BufferPool* pool) : CpuStageBase(std::move(layout), pool) {}

GptStage::~GptStage() = default;

absl::Status GptStage::LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, float* out) {
  const int32_t* segments = s.segments.data();
  const int64_t B = s.rows, T = s.seq;
  const int64_t N = B * T, C = config().hidden, F = config().ffn, NH = config().heads, QKV = config().QkvWidth();
  ASSIGN_OR_RETURN(a.ln1, Get(N * C));
  ASSIGN_OR_RETURN(a.ln1_mean, Get(N));
  ASSIGN_OR_RETURN(a.ln1_rstd, Get(N));
  NormForward(a.ln1.as<float>(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), a.x.as<float>(), l.ln1_w, l.ln1_b,
              N);
  ASSIGN_OR_RETURN(a.qkv, Get(N * QKV));
  cpu::MatmulForward(a.qkv.as<float>(), a.ln1.as<float>(), P(l.qkv_w), P(l.qkv_b), N, C, QKV);
  Rotate(config(), a.qkv.as<float>(), s.positions.data(), N, false);  // kept rotated, as attention reads them
  ASSIGN_OR_RETURN(a.atty, Get(N * C));
  ASSIGN_OR_RETURN(a.att, Get(cpu::AttentionProbsSize(segments, B, T, NH, CpuKernel(config().attention))));
  cpu::AttentionForward(a.atty.as<float>(), a.att.as<float>(), a.qkv.as<float>(), segments, B, T, C, NH,
                        CpuKernel(config().attention), SelfAttention(config()));
  ASSIGN_OR_RETURN(a.x2, Get(N * C));
  float* x2 = a.x2.as<float>();
  cpu::MatmulForward(x2, a.atty.as<float>(), P(l.proj_w), P(l.proj_b), N, C, C);
  const float* xin = a.x.as<float>();
  for (int64_t k = 0; k < N * C; ++k) x2[k] += xin[k];
  ASSIGN_OR_RETURN(a.ln2, Get(N * C));
  ASSIGN_OR_RETURN(a.ln2_mean, Get(N));
  ASSIGN_OR_RETURN(a.ln2_rstd, Get(N));
  NormForward(a.ln2.as<float>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(), x2, l.ln2_w, l.ln2_b, N);
  const int64_t W = config().MlpWidth();
  ASSIGN_OR_RETURN(a.fc, Get(N * W));
  ASSIGN_OR_RETURN(a.gelu, Get(N * F));
  cpu::MatmulForward(a.fc.as<float>(), a.ln2.as<float>(), P(l.fc_w), P(l.fc_b), N, C, W);
  ActivationForward(a.gelu.as<float>(), a.fc.as<float>(), N);
  if (out != nullptr) {
    cpu::MatmulForward(out, a.gelu.as<float>(), P(l.mproj_w), P(l.mproj_b), N, F, C);
    for (int64_t k = 0; k < N * C; ++k) out[k] += x2[k];
  }
  return absl::OkStatus();
}

// Training with the varlen kernel skips padding altogether: the real tokens
// of every row, in order, become one row whose samples keep their own
// segment ids (made unique across rows). Every per-token op then runs on
// real tokens only, and attention sees exactly the same samples, so the
// numbers are those of the dense batch (padding never reaches a real token
// and gets no gradient) up to the order of sums over rows in the weight
// gradients. The stage's input and output keep the full batch's shape:
// hidden states are gathered on the way in and scattered (zeros in
// padding) on the way out; gradients likewise.
absl::Status GptStage::Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                               float loss_scale, Recompute recompute) {
  ASSIGN_OR_RETURN(const double loss, ForwardImpl(mb, batch, hidden_in, hidden_out, loss_scale, recompute));
  loss_total_ += loss;
  return absl::OkStatus();
}


absl::StatusOr<double> GptStage::ForwardImpl(int mb, const TokenBatch& batch, const void* hidden_in_v,
                                             void* hidden_out_v, float loss_scale, Recompute recompute) {
  const auto* hidden_in = static_cast<const float*>(hidden_in_v);
  auto* hidden_out = static_cast<float*>(hidden_out_v);
  const bool compact = config().attention == AttentionKernel::kVarlen && mb != kInferKey &&
                       batch.real_tokens < batch.rows * batch.seq && batch.real_tokens > 0;
  if (!compact || stash_.contains(mb)) return ForwardDense(mb, batch, hidden_in, hidden_out, loss_scale, recompute);
  RETURN_IF_ERROR(CheckTokenBatch(batch, config()));
  const StageOptions& o = options();
  if (!o.first && hidden_in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (!o.last && hidden_out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  const int64_t C = config().hidden, cells = batch.rows * batch.seq;
  TokenBatch real;
  real.rows = 1;
  std::vector<int64_t> kept;
  int32_t base = 0;
  for (int64_t b = 0; b < batch.rows; ++b) {
    int32_t top = -1;
    for (int64_t t = 0; t < batch.seq; ++t) {
      const int64_t k = b * batch.seq + t;
      const int32_t sg = batch.segments[k];
      if (sg < 0) continue;
      kept.push_back(k);
      real.tokens.push_back(batch.tokens[k]);
      real.positions.push_back(batch.positions[k]);
      real.segments.push_back(base + sg);
      real.targets.push_back(batch.targets[k]);
      top = std::max(top, sg);
    }
    base += top + 1;
  }
  const int64_t n = static_cast<int64_t>(kept.size());
  real.seq = n;
  real.real_tokens = n;
  real.loss_tokens = batch.loss_tokens;
  Buffer in, out;
  if (!o.first) {
    ASSIGN_OR_RETURN(in, Get(n * C));
    for (int64_t r = 0; r < n; ++r) std::memcpy(in.as<float>() + r * C, hidden_in + kept[r] * C, C * sizeof(float));
  }
  if (!o.last) {
    ASSIGN_OR_RETURN(out, Get(n * C));
  }
  ASSIGN_OR_RETURN(double loss, ForwardDense(mb, real, in.as<float>(), out.as<float>(), loss_scale, recompute));
  if (!o.last) {
    std::memset(hidden_out, 0, cells * C * sizeof(float));
    for (int64_t r = 0; r < n; ++r) std::memcpy(hidden_out + kept[r] * C, out.as<float>() + r * C, C * sizeof(float));
  }
  Stash& s = *stash_.at(mb);
  s.kept = std::move(kept);
  s.full_cells = cells;
  return loss;
}

absl::StatusOr<double> GptStage::ForwardDense(int mb, const TokenBatch& batch, const float* hidden_in,
                                              float* hidden_out, float loss_scale, Recompute recompute) {
  const StageOptions& o = options();
  if (stash_.contains(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " forwarded twice"));
  RETURN_IF_ERROR(CheckTokenBatch(batch, config()));
  if (!o.first && hidden_in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (!o.last && hidden_out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  const int64_t B = batch.rows, T = batch.seq, N = B * T, C = config().hidden, V = config().vocab;
  auto s = std::make_unique<Stash>();
  s->rows = B;
  s->seq = T;
  s->segments = batch.segments;
  if (o.first) s->tokens = batch.tokens;
  if (o.first || config().rotary) s->positions = batch.positions;
  s->loss_scale = loss_scale;

  ASSIGN_OR_RETURN(Buffer x, Get(N * C));
  if (o.first) {
    cpu::EmbeddingForward(x.as<float>(), batch.tokens.data(), batch.positions.data(), P(layout_.wte()),
                          P(layout_.wpe()), N, C);
  } else {
    std::memcpy(x.data(), hidden_in, N * C * sizeof(float));  // the plan may free its slot after this
  }
  const auto& layers = layout_.layers();
  s->layers.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerActs& a = s->layers[i];
    a.x = std::move(x);
    // The layer's output goes straight to the stage output when nothing
    // follows on this stage but a send.
    const bool to_output = i + 1 == layers.size() && !o.last;
    Buffer next;
    float* out;
    if (to_output) {
      out = hidden_out;
    } else {
      ASSIGN_OR_RETURN(next, Get(N * C));
      out = next.as<float>();
    }
    RETURN_IF_ERROR(LayerForward(layers[i], a, *s, out));
    if (recompute == Recompute::kFull) {
      Buffer keep = std::move(a.x);
      a = LayerActs{};
      a.x = std::move(keep);
    } else if (recompute == Recompute::kSelective) {
      a.att.Release();
    }
    x = std::move(next);
  }
  if (layers.empty() && !o.last) std::memcpy(hidden_out, x.data(), N * C * sizeof(float));

  double loss = 0;
  if (o.last) {
    for (int64_t k = 0; k < N; ++k) {
      if (batch.targets[k] >= 0) {
        s->scored.push_back(k);
        s->targets.push_back(batch.targets[k]);
      }
    }
    const int64_t M = static_cast<int64_t>(s->scored.size());
    if (M > 0) {
      ASSIGN_OR_RETURN(s->xs, Get(M * C));
      const float* xf = x.as<float>();
      for (int64_t r = 0; r < M; ++r) std::memcpy(s->xs.as<float>() + r * C, xf + s->scored[r] * C, C * sizeof(float));
      ASSIGN_OR_RETURN(s->lnf, Get(M * C));
      ASSIGN_OR_RETURN(s->lnf_mean, Get(M));
      ASSIGN_OR_RETURN(s->lnf_rstd, Get(M));
      NormForward(s->lnf.as<float>(), s->lnf_mean.as<float>(), s->lnf_rstd.as<float>(), s->xs.as<float>(),
                  layout_.lnf_w(), layout_.lnf_b(), M);
      ASSIGN_OR_RETURN(Buffer logits, Get(M * V));
      cpu::MatmulForward(logits.as<float>(), s->lnf.as<float>(), P(layout_.head()), static_cast<const float*>(nullptr),
                         M, C, V);
      ASSIGN_OR_RETURN(s->probs, Get(M * V));
      loss = cpu::CrossEntropyForward(s->probs.as<float>(), logits.as<float>(), s->targets.data(), loss_scale, M, V);
    }
  }
  stash_[mb] = std::move(s);
  return loss;
}

absl::Status GptStage::Backward(int mb, const void* dhidden_out_v, void* dhidden_in_v, const GradsReady& ready) {
  const auto* dhidden_out = static_cast<const float*>(dhidden_out_v);
  auto* dhidden_in = static_cast<float*>(dhidden_in_v);
  auto it = stash_.find(mb);
  if (it == stash_.end() || it->second->kept.empty()) return BackwardDense(mb, dhidden_out, dhidden_in, ready);
  const StageOptions& o = options();
  if (!o.last && dhidden_out == nullptr) return absl::InvalidArgumentError("output gradient: missing");
  if (!o.first && dhidden_in == nullptr) return absl::InvalidArgumentError("input gradient: missing");
  const std::vector<int64_t> kept = std::move(it->second->kept);
  const int64_t C = config().hidden, n = static_cast<int64_t>(kept.size()), cells = it->second->full_cells;
  Buffer dout, din;
  if (!o.last) {
    ASSIGN_OR_RETURN(dout, Get(n * C));
    for (int64_t r = 0; r < n; ++r) std::memcpy(dout.as<float>() + r * C, dhidden_out + kept[r] * C, C * sizeof(float));
  }
  if (!o.first) {
    ASSIGN_OR_RETURN(din, Get(n * C));
  }
  RETURN_IF_ERROR(BackwardDense(mb, dout.as<float>(), din.as<float>(), ready));
  if (!o.first) {
    std::memset(dhidden_in, 0, cells * C * sizeof(float));
    for (int64_t r = 0; r < n; ++r) std::memcpy(dhidden_in + kept[r] * C, din.as<float>() + r * C, C * sizeof(float));
  }
  return absl::OkStatus();
}

namespace {

// Tells `ready` (if any) that the gradients of [offset, offset + size) are final.
absl::Status Report(const Stage::GradsReady& ready, size_t offset, size_t size) {
  return ready ? ready(offset, size) : absl::OkStatus();
}

void Zero(Buffer& b) { std::memset(b.data(), 0, b.bytes()); }

}  // namespace

// Gradient scratch of a layer's backward, shared by every layer of the stage.
struct GptStage::LayerGrads {
  Buffer dF1, dF2;  // (N, F)
  Buffer dln;       // (N, C)
  Buffer datty;     // (N, C)
  Buffer dqkv;      // (N, 3C)
};

absl::Status GptStage::BackwardDense(int mb, const float* dhidden_out, float* dhidden_in, const GradsReady& ready) {
  const StageOptions& o = options();
  auto it = stash_.find(mb);
  if (it == stash_.end()) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " was not forwarded"));
  if (!o.last && dhidden_out == nullptr) return absl::InvalidArgumentError("output gradient: missing");
  if (!o.first && dhidden_in == nullptr) return absl::InvalidArgumentError("input gradient: missing");
  std::unique_ptr<Stash> s = std::move(it->second);
  stash_.erase(it);
  const int64_t B = s->rows, T = s->seq, N = B * T, C = config().hidden, F = config().ffn, V = config().vocab;

  // Gradient of the residual stream, accumulated layer by layer downwards.
  ASSIGN_OR_RETURN(Buffer dres, Get(N * C));
  if (o.last) {
    Zero(dres);
    RETURN_IF_ERROR(HeadBackward(*s, dres.as<float>()));
    // The head's parameters are final: the final LayerNorm and an untied head
    // (the end of the layout), and a tied embedding unless the embedding
    // backward of this same stage still adds to it.
    RETURN_IF_ERROR(Report(ready, layout_.lnf_w(), layout_.num_params() - layout_.lnf_w()));
    if (config().tie_embeddings && !o.first) RETURN_IF_ERROR(Report(ready, layout_.wte(), static_cast<size_t>(V) * C));
  } else {
    std::memcpy(dres.data(), dhidden_out, N * C * sizeof(float));
  }
  LayerGrads g;
  ASSIGN_OR_RETURN(g.dF1, Get(N * F));
  ASSIGN_OR_RETURN(g.dF2, Get(N * config().MlpWidth()));
  ASSIGN_OR_RETURN(g.dln, Get(N * C));
  ASSIGN_OR_RETURN(g.datty, Get(N * C));
  ASSIGN_OR_RETURN(g.dqkv, Get(N * config().QkvWidth()));
  float* dr = dres.as<float>();
  const auto& layers = layout_.layers();
  for (size_t i = layers.size(); i-- > 0;) {
    const GptLayout::Layer& l = layers[i];
    RETURN_IF_ERROR(LayerBackward(l, s->layers[i], *s, dr, g));
    s->layers[i] = LayerActs{};  // release this layer's activations early
    const size_t end = i + 1 < layers.size() ? layers[i + 1].ln1_w : (o.last ? layout_.lnf_w() : layout_.num_params());
    RETURN_IF_ERROR(Report(ready, l.ln1_w, end - l.ln1_w));
  }
  if (o.first) {
    cpu::EmbeddingBackward(G(layout_.wte()), G(layout_.wpe()), dr, s->tokens.data(), s->positions.data(), N, C);
    const size_t after = layers.empty() ? (o.last ? layout_.lnf_w() : layout_.num_params()) : layers[0].ln1_w;
    const bool wpe = layout_.wpe() != GptLayout::kAbsent;  // absent with rotary positions
    RETURN_IF_ERROR(Report(ready, layout_.wte(), (wpe ? layout_.wpe() : after) - layout_.wte()));
    if (wpe) RETURN_IF_ERROR(Report(ready, layout_.wpe(), after - layout_.wpe()));
  } else {
    std::memcpy(dhidden_in, dr, N * C * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status GptStage::HeadBackward(Stash& s, float* dres) {
  const int64_t C = config().hidden, V = config().vocab, M = static_cast<int64_t>(s.scored.size());
  if (M == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Buffer dlogits, Get(M * V));
  Zero(dlogits);
  cpu::CrossEntropyBackward(dlogits.as<float>(), s.probs.as<float>(), s.targets.data(), s.loss_scale, M, V);
  s.probs.Release();
  ASSIGN_OR_RETURN(Buffer dlnf, Get(M * C));
  ASSIGN_OR_RETURN(Buffer dxs, Get(M * C));
  Zero(dlnf);
  Zero(dxs);
  cpu::MatmulBackward(dlnf.as<float>(), G(layout_.head()), static_cast<float*>(nullptr), dlogits.as<const float>(),
                      s.lnf.as<const float>(), P(layout_.head()), M, C, V);
  NormBackward(dxs.as<float>(), layout_.lnf_w(), layout_.lnf_b(), dlnf.as<const float>(), s.xs.as<const float>(),
               s.lnf_mean.as<const float>(), s.lnf_rstd.as<const float>(), M);
  for (int64_t r = 0; r < M; ++r) std::memcpy(dres + s.scored[r] * C, dxs.as<float>() + r * C, C * sizeof(float));
  return absl::OkStatus();
}

absl::Status GptStage::LayerBackward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, float* dr,
                                     LayerGrads& g) {
  const int64_t B = s.rows, T = s.seq, N = B * T, C = config().hidden, F = config().ffn, NH = config().heads;
  const int64_t QKV = config().QkvWidth();
  if (a.ln1.empty()) {
    RETURN_IF_ERROR(LayerForward(l, a, s, nullptr));  // kFull: the whole layer again
  } else if (a.att.empty()) {
    // kSelective: the attention probabilities again (its output is stashed).
    ASSIGN_OR_RETURN(a.att, Get(cpu::AttentionProbsSize(s.segments.data(), B, T, NH, CpuKernel(config().attention))));
    ASSIGN_OR_RETURN(Buffer atty, Get(N * C));
    cpu::AttentionForward(atty.as<float>(), a.att.as<float>(), a.qkv.as<float>(), s.segments.data(), B, T, C, NH,
                          CpuKernel(config().attention), SelfAttention(config()));
  }
  // MLP branch.
  Zero(g.dF1);
  cpu::MatmulBackward(g.dF1.as<float>(), G(l.mproj_w), G(l.mproj_b), dr, a.gelu.as<const float>(), P(l.mproj_w), N, F,
                      C);
  Zero(g.dF2);
  ActivationBackward(g.dF2.as<float>(), a.fc.as<const float>(), g.dF1.as<const float>(), N);
  Zero(g.dln);
  cpu::MatmulBackward(g.dln.as<float>(), G(l.fc_w), G(l.fc_b), g.dF2.as<const float>(), a.ln2.as<const float>(),
                      P(l.fc_w), N, C, config().MlpWidth());
  NormBackward(dr, l.ln2_w, l.ln2_b, g.dln.as<const float>(), a.x2.as<const float>(), a.ln2_mean.as<const float>(),
               a.ln2_rstd.as<const float>(), N);
  // Attention branch.
  Zero(g.datty);
  cpu::MatmulBackward(g.datty.as<float>(), G(l.proj_w), G(l.proj_b), dr, a.atty.as<const float>(), P(l.proj_w), N, C,
                      C);
  Zero(g.dqkv);
  cpu::AttentionBackward(g.dqkv.as<float>(), g.datty.as<const float>(), a.qkv.as<const float>(),
                         a.att.as<const float>(), s.segments.data(), B, T, C, NH, CpuKernel(config().attention),
                         SelfAttention(config()));
  Rotate(config(), g.dqkv.as<float>(), s.positions.data(), N, true);
  Zero(g.dln);
  cpu::MatmulBackward(g.dln.as<float>(), G(l.qkv_w), G(l.qkv_b), g.dqkv.as<const float>(), a.ln1.as<const float>(),
                      P(l.qkv_w), N, C, QKV);
  NormBackward(dr, l.ln1_w, l.ln1_b, g.dln.as<const float>(), a.x.as<const float>(), a.ln1_mean.as<const float>(),
               a.ln1_rstd.as<const float>(), N);
  return absl::OkStatus();
}

absl::Status GptStage::Infer(const TokenBatch& batch, const void* hidden_in, void* out) {
  // Run the training forward on a private key, then drop the stash; the last
  // stage computes the head for every position by scoring them all.
  const int64_t N = batch.rows * batch.seq, C = config().hidden, V = config().vocab;
  if (!options().last) {
    RETURN_IF_ERROR(ForwardImpl(kInferKey, batch, hidden_in, out, 0.0f, Recompute::kFull).status());
    stash_.erase(kInferKey);
    return absl::OkStatus();
  }
  TokenBatch all = batch;
  for (int64_t k = 0; k < N; ++k) all.targets[k] = std::max(all.targets[k], 0);
  RETURN_IF_ERROR(ForwardImpl(kInferKey, all, hidden_in, nullptr, 0.0f, Recompute::kFull).status());
  const Stash& s = *stash_.at(kInferKey);
  cpu::MatmulForward(static_cast<float*>(out), s.lnf.as<const float>(), P(layout_.head()),
                     static_cast<const float*>(nullptr), N, C, V);
  stash_.erase(kInferKey);
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::model
