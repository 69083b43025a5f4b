#include "runtime/model/t5.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cpu/ops.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cpu = ::dynapipe::runtime::cpu;

// What backward needs from one layer's forward (the cross-attention's part
// on decoder layers only).
struct T5Stage::LayerActs {
  Buffer x;                                            // layer input (N, C)
  Buffer ln1, mean1, rstd1, qkv, att, atty, x1;        // self-attention; x1 = x + proj(atty)
  Buffer ln3, mean3, rstd3, q, kv, xatt, xy, x2;       // cross-attention; x2 = x1 + xproj(xy)
  Buffer ln2, mean2, rstd2, fc, act;                   // feed-forward on x2 (decoder) or x1
  const float* mlp_in() const { return (xy.data() != nullptr ? x2 : x1).as<float>(); }
};

struct T5Stage::Grid {
  int64_t rows = 0, seq = 0;
  const int32_t* segments = nullptr;
  int64_t n() const { return rows * seq; }
};

struct T5Stage::Stash {
  TokenBatch batch;  // a copy: backward reads its tokens, segments and targets
  std::vector<LayerActs> layers;
  Buffer enc_last, enc_mean, enc_rstd, enc_out;  // the encoder's last hidden state, its final norm
  Buffer dec_last, lnf, lnf_mean, lnf_rstd, probs, logits;
  float loss_scale = 0;
  Recompute recompute = Recompute::kNone;
  Grid enc() const { return {batch.rows, batch.enc_seq, batch.enc_segments.data()}; }
  Grid dec() const { return {batch.rows, batch.seq, batch.segments.data()}; }
};

namespace {

cpu::AttentionKernel CpuKernel(AttentionKernel k) {
  return k == AttentionKernel::kMaterialized ? cpu::AttentionKernel::kMaterialized : cpu::AttentionKernel::kVarlen;
}

// out[n] = wte[tokens[n]] (no positions: T5's are relative).
void Embed(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * C, wte + static_cast<int64_t>(tokens[n]) * C, C * sizeof(float));
}
void EmbedBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    float* row = dwte + static_cast<int64_t>(tokens[n]) * C;
    for (int64_t c = 0; c < C; ++c) row[c] += dout[n * C + c];
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<T5Stage>> T5Stage::Create(const GptConfig& config, const StageOptions& options,
                                                         BufferPool* pool) {
  if (pool == nullptr) return absl::InvalidArgumentError("T5Stage: pool is null");
  if (!config.encoder_decoder) return absl::InvalidArgumentError("T5Stage: the model is not an encoder-decoder");
  ASSIGN_OR_RETURN(GptLayout layout, GptLayout::Make(config, options));
  return std::unique_ptr<T5Stage>(new T5Stage(std::move(layout), pool));
}

T5Stage::T5Stage(GptLayout layout, BufferPool* pool) : CpuStageBase(std::move(layout), pool) {}
T5Stage::~T5Stage() = default;

absl::StatusOr<Buffer> T5Stage::Zeros(int64_t floats) {
  ASSIGN_OR_RETURN(Buffer b, Get(floats));
  std::fill_n(b.as<float>(), floats, 0.0f);
  return b;
}

absl::StatusOr<Buffer> T5Stage::Copy(const float* src, int64_t floats) {
  ASSIGN_OR_RETURN(Buffer b, Get(floats));
  std::memcpy(b.data(), src, static_cast<size_t>(floats) * sizeof(float));
  return b;
}

absl::Status T5Stage::Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                              float loss_scale, Recompute recompute) {
  if (stash_.contains(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " is in flight"));
  const absl::StatusOr<double> loss = ForwardImpl(mb, batch, static_cast<const float*>(hidden_in),
                                                  static_cast<float*>(hidden_out), loss_scale, recompute);
  if (!loss.ok()) {
    stash_.erase(mb);  // nothing half-kept: the micro-batch is not in flight
    return loss.status();
  }
  loss_total_ += *loss;
  return absl::OkStatus();
}

absl::Status T5Stage::Infer(const TokenBatch& batch, const void* hidden_in, void* out) {
  if (out == nullptr) return absl::InvalidArgumentError("T5 stage: no output buffer");
  const bool last = options().last;
  absl::StatusOr<double> loss = ForwardImpl(kInferKey, batch, static_cast<const float*>(hidden_in),
                                            last ? nullptr : static_cast<float*>(out), 0.0f, Recompute::kFull);
  auto it = stash_.find(kInferKey);
  if (loss.ok() && last) {
    const Stash& s = *it->second;
    std::memcpy(out, s.logits.data(), static_cast<size_t>(s.batch.rows * s.batch.seq * config().vocab) * sizeof(float));
  }
  if (it != stash_.end()) stash_.erase(it);
  return loss.status();
}

// The stage's input (GptConfig::BoundaryElements): the encoder's tokens on
// the first stage; inside the encoder its hidden state; from its end on the
// encoder output, then (past it) the decoder's hidden state. Returns the
// current stack's hidden state (empty where the decoder starts here).
absl::StatusOr<Buffer> T5Stage::StageInput(Stash& s, const float* in) {
  const int64_t C = config().hidden, Ne = s.enc().n(), Nd = s.dec().n();
  const int E = config().num_layers, lo = options().first_layer;
  if (options().first) {
    ASSIGN_OR_RETURN(Buffer x, Get(Ne * C));
    Embed(x.as<float>(), s.batch.enc_tokens.data(), P(layout_.wte()), Ne, C);
    return x;
  }
  if (in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (lo < E) return Copy(in, Ne * C);
  ASSIGN_OR_RETURN(s.enc_out, Copy(in, Ne * C));
  if (lo == E) return Buffer();
  return Copy(in + Ne * C, Nd * C);
}

absl::StatusOr<double> T5Stage::ForwardImpl(int key, const TokenBatch& batch, const float* in, float* out,
                                            float loss_scale, Recompute recompute) {
  RETURN_IF_ERROR(CheckTokenBatch(batch, config()));
  if (!options().last && out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  const int64_t C = config().hidden;
  const int E = config().num_layers, lo = options().first_layer, hi = lo + options().num_layers;
  auto owned = std::make_unique<Stash>();
  Stash& s = *owned;
  s.batch = batch;
  s.loss_scale = loss_scale;
  s.recompute = recompute;
  stash_[key] = std::move(owned);
  const Grid enc = s.enc(), dec = s.dec();
  const GptLayout& lay = layout_;
  ASSIGN_OR_RETURN(Buffer x, StageInput(s, in));
  s.layers.resize(lay.layers().size());
  for (int i = lo; i < hi; ++i) {
    const GptLayout::Layer& l = lay.layers()[i - lo];
    LayerActs& a = s.layers[i - lo];
    if (i == E) {  // the decoder starts: its embedded tokens
      ASSIGN_OR_RETURN(x, Get(dec.n() * C));
      Embed(x.as<float>(), s.batch.tokens.data(), P(lay.wte()), dec.n(), C);
    }
    a.x = std::move(x);
    const Grid& g = l.decoder ? dec : enc;
    ASSIGN_OR_RETURN(x, Get(g.n() * C));
    RETURN_IF_ERROR(LayerForward(l, a, g, enc, s.enc_out.as<float>(), x.as<float>()));
    Drop(a, recompute);
    if (i == E - 1) {  // the encoder ends: its final norm gives the output every decoder layer reads
      s.enc_last = std::move(x);
      ASSIGN_OR_RETURN(s.enc_mean, Get(enc.n()));
      ASSIGN_OR_RETURN(s.enc_rstd, Get(enc.n()));
      ASSIGN_OR_RETURN(s.enc_out, Get(enc.n() * C));
      NormForward(s.enc_out.as<float>(), s.enc_mean.as<float>(), s.enc_rstd.as<float>(), s.enc_last.as<float>(),
                  lay.enc_lnf_w(), GptLayout::kAbsent, enc.n());
    }
  }
  if (options().last) return Head(s, std::move(x));
  // The stage's output, laid out as the next stage's input.
  if (hi < E) {
    std::memcpy(out, x.data(), static_cast<size_t>(enc.n() * C) * sizeof(float));
  } else {
    std::memcpy(out, s.enc_out.data(), static_cast<size_t>(enc.n() * C) * sizeof(float));
    if (hi > E) std::memcpy(out + enc.n() * C, x.data(), static_cast<size_t>(dec.n() * C) * sizeof(float));
  }
  return 0.0;
}

// The last stage's head: final norm, T5's scale of a tied head, logits, loss.
absl::StatusOr<double> T5Stage::Head(Stash& s, Buffer x) {
  const int64_t C = config().hidden, V = config().vocab, N = s.dec().n();
  const GptLayout& lay = layout_;
  s.dec_last = std::move(x);
  ASSIGN_OR_RETURN(s.lnf, Get(N * C));
  ASSIGN_OR_RETURN(s.lnf_mean, Get(N));
  ASSIGN_OR_RETURN(s.lnf_rstd, Get(N));
  NormForward(s.lnf.as<float>(), s.lnf_mean.as<float>(), s.lnf_rstd.as<float>(), s.dec_last.as<float>(),
              lay.lnf_w(), GptLayout::kAbsent, N);
  if (config().tie_embeddings) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(C));
    for (int64_t k = 0; k < N * C; ++k) s.lnf.as<float>()[k] *= scale;
  }
  ASSIGN_OR_RETURN(s.logits, Get(N * V));
  ASSIGN_OR_RETURN(s.probs, Get(N * V));
  cpu::MatmulForward(s.logits.as<float>(), s.lnf.as<float>(), P(lay.head()), static_cast<const float*>(nullptr), N,
                     C, V);
  return cpu::CrossEntropyForward(s.probs.as<float>(), s.logits.as<float>(), s.batch.targets.data(), s.loss_scale,
                                  N, V);
}

// The layer's self-attention: bidirectional in the encoder, causal in the
// decoder, unscaled, with its stack's relative position bias.
cpu::AttentionOptions<float> T5Stage::SelfAttention(const GptLayout::Layer& l) {
  cpu::AttentionOptions<float> opt;
  opt.causal = l.decoder;
  opt.scaled = false;
  opt.bias = P(l.decoder ? layout_.dec_rel() : layout_.enc_rel());
  opt.buckets = config().relative_buckets;
  opt.max_distance = config().relative_max_distance;
  return opt;
}

// What forward drops after a layer: with kFull everything but its input;
// with kSelective the attention probabilities (self and cross).
void T5Stage::Drop(LayerActs& a, Recompute recompute) {
  if (recompute == Recompute::kSelective) {
    a.att = Buffer();
    a.xatt = Buffer();
  } else if (recompute == Recompute::kFull) {
    Buffer x = std::move(a.x);
    a = LayerActs();
    a.x = std::move(x);
  }
}

// Before a layer's backward, what its forward dropped, recomputed by the
// same arithmetic in the same order: the gradients are bit-identical to
// those of a forward that kept everything.
absl::Status T5Stage::Restore(const GptLayout::Layer& l, LayerActs& a, const Grid& g, const Grid& enc_grid,
                              const float* enc, Recompute recompute) {
  const int64_t C = config().hidden, NH = config().heads;
  if (recompute == Recompute::kFull) {
    ASSIGN_OR_RETURN(Buffer out, Get(g.n() * C));
    return LayerForward(l, a, g, enc_grid, enc, out.as<float>());
  }
  if (recompute != Recompute::kSelective) return absl::OkStatus();
  const cpu::AttentionKernel kernel = CpuKernel(config().attention);
  ASSIGN_OR_RETURN(Buffer scratch, Get(g.n() * C));
  ASSIGN_OR_RETURN(a.att, Get(cpu::AttentionProbsSize(g.segments, g.rows, g.seq, NH, kernel)));
  cpu::AttentionForward(scratch.as<float>(), a.att.as<float>(), a.qkv.as<const float>(), g.segments, g.rows, g.seq,
                        C, NH, kernel, SelfAttention(l));
  if (l.decoder) {
    ASSIGN_OR_RETURN(a.xatt, Get(cpu::CrossAttentionProbsSize(g.segments, enc_grid.segments, g.rows, g.seq,
                                                              enc_grid.seq, NH)));
    cpu::CrossAttentionForward(scratch.as<float>(), a.xatt.as<float>(), a.q.as<const float>(),
                               a.kv.as<const float>(), g.segments, enc_grid.segments, g.rows, g.seq, enc_grid.seq, C,
                               NH, /*scaled=*/false);
  }
  return absl::OkStatus();
}

absl::Status T5Stage::LayerForward(const GptLayout::Layer& l, LayerActs& a, const Grid& g, const Grid& enc_grid,
                                   const float* enc, float* out) {
  const int64_t N = g.n(), C = config().hidden, F = config().ffn, W = config().MlpWidth(), NH = config().heads;
  const cpu::AttentionKernel kernel = CpuKernel(config().attention);
  const cpu::AttentionOptions<float> opt = SelfAttention(l);
  ASSIGN_OR_RETURN(a.ln1, Get(N * C));
  ASSIGN_OR_RETURN(a.mean1, Get(N));
  ASSIGN_OR_RETURN(a.rstd1, Get(N));
  NormForward(a.ln1.as<float>(), a.mean1.as<float>(), a.rstd1.as<float>(), a.x.as<float>(), l.ln1_w, l.ln1_b, N);
  ASSIGN_OR_RETURN(a.qkv, Get(N * 3 * C));
  cpu::MatmulForward(a.qkv.as<float>(), a.ln1.as<float>(), P(l.qkv_w), P(l.qkv_b), N, C, 3 * C);
  ASSIGN_OR_RETURN(a.att, Get(cpu::AttentionProbsSize(g.segments, g.rows, g.seq, NH, kernel)));
  ASSIGN_OR_RETURN(a.atty, Get(N * C));
  cpu::AttentionForward(a.atty.as<float>(), a.att.as<float>(), a.qkv.as<const float>(), g.segments, g.rows, g.seq, C,
                        NH, kernel, opt);
  ASSIGN_OR_RETURN(a.x1, Get(N * C));
  cpu::MatmulForward(a.x1.as<float>(), a.atty.as<float>(), P(l.proj_w), P(l.proj_b), N, C, C);
  for (int64_t k = 0; k < N * C; ++k) a.x1.as<float>()[k] += a.x.as<float>()[k];
  if (l.decoder) {
    const int64_t Ne = enc_grid.n();
    ASSIGN_OR_RETURN(a.ln3, Get(N * C));
    ASSIGN_OR_RETURN(a.mean3, Get(N));
    ASSIGN_OR_RETURN(a.rstd3, Get(N));
    NormForward(a.ln3.as<float>(), a.mean3.as<float>(), a.rstd3.as<float>(), a.x1.as<float>(), l.ln3_w,
                GptLayout::kAbsent, N);
    ASSIGN_OR_RETURN(a.q, Get(N * C));
    cpu::MatmulForward(a.q.as<float>(), a.ln3.as<float>(), P(l.xq_w), static_cast<const float*>(nullptr), N, C, C);
    ASSIGN_OR_RETURN(a.kv, Get(Ne * 2 * C));
    cpu::MatmulForward(a.kv.as<float>(), enc, P(l.xkv_w), static_cast<const float*>(nullptr), Ne, C, 2 * C);
    ASSIGN_OR_RETURN(a.xatt,
                     Get(cpu::CrossAttentionProbsSize(g.segments, enc_grid.segments, g.rows, g.seq, enc_grid.seq, NH)));
    ASSIGN_OR_RETURN(a.xy, Get(N * C));
    cpu::CrossAttentionForward(a.xy.as<float>(), a.xatt.as<float>(), a.q.as<const float>(), a.kv.as<const float>(),
                               g.segments, enc_grid.segments, g.rows, g.seq, enc_grid.seq, C, NH, /*scaled=*/false);
    ASSIGN_OR_RETURN(a.x2, Get(N * C));
    cpu::MatmulForward(a.x2.as<float>(), a.xy.as<float>(), P(l.xproj_w), static_cast<const float*>(nullptr), N, C, C);
    for (int64_t k = 0; k < N * C; ++k) a.x2.as<float>()[k] += a.x1.as<float>()[k];
  }
  const float* h = a.mlp_in();
  ASSIGN_OR_RETURN(a.ln2, Get(N * C));
  ASSIGN_OR_RETURN(a.mean2, Get(N));
  ASSIGN_OR_RETURN(a.rstd2, Get(N));
  NormForward(a.ln2.as<float>(), a.mean2.as<float>(), a.rstd2.as<float>(), h, l.ln2_w, l.ln2_b, N);
  ASSIGN_OR_RETURN(a.fc, Get(N * W));
  cpu::MatmulForward(a.fc.as<float>(), a.ln2.as<float>(), P(l.fc_w), P(l.fc_b), N, C, W);
  ASSIGN_OR_RETURN(a.act, Get(N * F));
  ActivationForward(a.act.as<float>(), a.fc.as<float>(), N);
  cpu::MatmulForward(out, a.act.as<float>(), P(l.mproj_w), P(l.mproj_b), N, F, C);
  for (int64_t k = 0; k < N * C; ++k) out[k] += h[k];
  return absl::OkStatus();
}

// The head's backward into the gradient of the decoder's last hidden state.
absl::StatusOr<Buffer> T5Stage::HeadBackward(const Stash& s) {
  const GptLayout& lay = layout_;
  const int64_t C = config().hidden, V = config().vocab, N = s.dec().n();
  ASSIGN_OR_RETURN(Buffer dlogits, Zeros(N * V));
  cpu::CrossEntropyBackward(dlogits.as<float>(), s.probs.as<const float>(), s.batch.targets.data(), s.loss_scale, N,
                            V);
  ASSIGN_OR_RETURN(Buffer dz, Zeros(N * C));
  cpu::MatmulBackward(dz.as<float>(), G(lay.head()), static_cast<float*>(nullptr), dlogits.as<const float>(),
                      s.lnf.as<const float>(), P(lay.head()), N, C, V);
  if (config().tie_embeddings) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(C));
    for (int64_t k = 0; k < N * C; ++k) dz.as<float>()[k] *= scale;
  }
  ASSIGN_OR_RETURN(Buffer dr, Zeros(N * C));
  NormBackward(dr.as<float>(), lay.lnf_w(), GptLayout::kAbsent, dz.as<const float>(), s.dec_last.as<const float>(),
               s.lnf_mean.as<const float>(), s.lnf_rstd.as<const float>(), N);
  return dr;
}

absl::Status T5Stage::Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) {
  auto it = stash_.find(mb);
  if (it == stash_.end()) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " is not in flight"));
  std::unique_ptr<Stash> owned = std::move(it->second);
  stash_.erase(it);
  Stash& s = *owned;
  const GptLayout& lay = layout_;
  const int64_t C = config().hidden;
  const int E = config().num_layers, lo = options().first_layer, hi = lo + options().num_layers;
  const Grid enc = s.enc(), dec = s.dec();
  const auto* dout = static_cast<const float*>(dhidden_out);
  if (!options().last && dout == nullptr) return absl::InvalidArgumentError("stage output gradient: missing");
  // The output's gradient: the current stack's (dr) and, from the encoder's
  // end on, the encoder output's (denc), which every decoder layer adds to.
  Buffer dr, denc;
  if (hi >= E) {
    ASSIGN_OR_RETURN(denc, Zeros(enc.n() * C));
  }
  if (options().last) {
    ASSIGN_OR_RETURN(dr, HeadBackward(s));
  } else if (hi < E) {
    ASSIGN_OR_RETURN(dr, Copy(dout, enc.n() * C));
  } else {
    std::memcpy(denc.data(), dout, static_cast<size_t>(enc.n() * C) * sizeof(float));
    if (hi > E) {
      ASSIGN_OR_RETURN(dr, Copy(dout + enc.n() * C, dec.n() * C));
    }
  }
  for (int i = hi; i-- > lo;) {
    const GptLayout::Layer& l = lay.layers()[i - lo];
    if (i == E - 1) {  // through the encoder's final norm into its last layer
      ASSIGN_OR_RETURN(dr, Zeros(enc.n() * C));
      NormBackward(dr.as<float>(), lay.enc_lnf_w(), GptLayout::kAbsent, denc.as<const float>(),
                   s.enc_last.as<const float>(), s.enc_mean.as<const float>(), s.enc_rstd.as<const float>(), enc.n());
    }
    RETURN_IF_ERROR(Restore(l, s.layers[i - lo], l.decoder ? dec : enc, enc, s.enc_out.as<const float>(),
                            s.recompute));
    RETURN_IF_ERROR(LayerBackward(l, s.layers[i - lo], l.decoder ? dec : enc, enc, s.enc_out.as<const float>(),
                                  dr.as<float>(), denc.as<float>()));
    s.layers[i - lo] = LayerActs();  // done with: back to the pool
    if (i == E) EmbedBackward(G(lay.wte()), dr.as<const float>(), s.batch.tokens.data(), dec.n(), C);
  }
  // The input's gradient, laid out as the previous stage's output.
  auto* din = static_cast<float*>(dhidden_in);
  if (options().first) {
    EmbedBackward(G(lay.wte()), dr.as<const float>(), s.batch.enc_tokens.data(), enc.n(), C);
  } else if (din == nullptr) {
    return absl::InvalidArgumentError("stage input gradient: missing");
  } else if (lo < E) {
    std::memcpy(din, dr.data(), static_cast<size_t>(enc.n() * C) * sizeof(float));
  } else {
    std::memcpy(din, denc.data(), static_cast<size_t>(enc.n() * C) * sizeof(float));
    if (lo > E) std::memcpy(din + enc.n() * C, dr.data(), static_cast<size_t>(dec.n() * C) * sizeof(float));
  }
  return ready ? ready(0, lay.num_params()) : absl::OkStatus();
}

absl::Status T5Stage::LayerBackward(const GptLayout::Layer& l, const LayerActs& a, const Grid& g,
                                    const Grid& enc_grid, const float* enc, float* dr, float* denc) {
  const int64_t N = g.n(), C = config().hidden, F = config().ffn, W = config().MlpWidth(), NH = config().heads;
  const cpu::AttentionKernel kernel = CpuKernel(config().attention);
  // Feed-forward: out = h + mproj(act(fc(norm2(h)))).
  ASSIGN_OR_RETURN(Buffer dact, Zeros(N * F));
  cpu::MatmulBackward(dact.as<float>(), G(l.mproj_w), G(l.mproj_b), dr, a.act.as<const float>(), P(l.mproj_w), N, F,
                      C);
  ASSIGN_OR_RETURN(Buffer dfc, Zeros(N * W));
  ActivationBackward(dfc.as<float>(), a.fc.as<const float>(), dact.as<const float>(), N);
  ASSIGN_OR_RETURN(Buffer dln, Zeros(N * C));
  cpu::MatmulBackward(dln.as<float>(), G(l.fc_w), G(l.fc_b), dfc.as<const float>(), a.ln2.as<const float>(),
                      P(l.fc_w), N, C, W);
  NormBackward(dr, l.ln2_w, l.ln2_b, dln.as<const float>(), a.mlp_in(), a.mean2.as<const float>(),
               a.rstd2.as<const float>(), N);
  if (l.decoder) {  // x2 = x1 + xproj(cross(q(norm3(x1)), kv(enc)))
    const int64_t Ne = enc_grid.n();
    ASSIGN_OR_RETURN(Buffer dxy, Zeros(N * C));
    cpu::MatmulBackward(dxy.as<float>(), G(l.xproj_w), static_cast<float*>(nullptr), dr, a.xy.as<const float>(),
                        P(l.xproj_w), N, C, C);
    ASSIGN_OR_RETURN(Buffer dq, Zeros(N * C));
    ASSIGN_OR_RETURN(Buffer dkv, Zeros(Ne * 2 * C));
    cpu::CrossAttentionBackward(dq.as<float>(), dkv.as<float>(), dxy.as<const float>(), a.q.as<const float>(),
                                a.kv.as<const float>(), a.xatt.as<const float>(), g.segments, enc_grid.segments,
                                g.rows, g.seq, enc_grid.seq, C, NH, /*scaled=*/false);
    cpu::MatmulBackward(denc, G(l.xkv_w), static_cast<float*>(nullptr), dkv.as<const float>(), enc, P(l.xkv_w), Ne,
                        C, 2 * C);
    std::fill_n(dln.as<float>(), N * C, 0.0f);
    cpu::MatmulBackward(dln.as<float>(), G(l.xq_w), static_cast<float*>(nullptr), dq.as<const float>(),
                        a.ln3.as<const float>(), P(l.xq_w), N, C, C);
    NormBackward(dr, l.ln3_w, GptLayout::kAbsent, dln.as<const float>(), a.x1.as<const float>(),
                 a.mean3.as<const float>(), a.rstd3.as<const float>(), N);
  }
  // Self-attention: x1 = x + proj(attention(qkv(norm1(x)))).
  ASSIGN_OR_RETURN(Buffer datty, Zeros(N * C));
  cpu::MatmulBackward(datty.as<float>(), G(l.proj_w), G(l.proj_b), dr, a.atty.as<const float>(), P(l.proj_w), N, C,
                      C);
  ASSIGN_OR_RETURN(Buffer dqkv, Zeros(N * 3 * C));
  const cpu::AttentionOptions<float> opt = SelfAttention(l);
  const size_t table = l.decoder ? layout_.dec_rel() : layout_.enc_rel();
  cpu::AttentionBackward(dqkv.as<float>(), datty.as<const float>(), a.qkv.as<const float>(), a.att.as<const float>(),
                         g.segments, g.rows, g.seq, C, NH, kernel, opt, G(table));
  std::fill_n(dln.as<float>(), N * C, 0.0f);
  cpu::MatmulBackward(dln.as<float>(), G(l.qkv_w), G(l.qkv_b), dqkv.as<const float>(), a.ln1.as<const float>(),
                      P(l.qkv_w), N, C, 3 * C);
  NormBackward(dr, l.ln1_w, l.ln1_b, dln.as<const float>(), a.x.as<const float>(), a.mean1.as<const float>(),
               a.rstd1.as<const float>(), N);
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::model
