// CudaT5Stage: one layer's forward and backward, and the stage's backward
// over its layers.

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/embedding.h"
#include "runtime/model/t5_cuda.h"
#include "runtime/model/t5_cuda_stash.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cuda = ::dynapipe::runtime::cuda;
using bf16 = __nv_bfloat16;

namespace {
constexpr size_t kBf16 = sizeof(bf16);
}  // namespace

// Gradient scratch of a layer's backward, shared by every layer of the
// stage: sized for the larger of the two grids (rows N).
struct CudaT5Stage::LayerGrads {
  Buffer dF, dfc, dln, datty, dqkv, dxy, dq;  // (N, F), (N, MlpWidth), (N, C) x3, (N, 3C), (N, C)
  Buffer dkv;                                 // (N_enc, 2C)
  Buffer scratch;                             // (N, NH) fp32: the attention's row sums
};

cuda::T5AttentionArgs CudaT5Stage::SelfAttention(const GptLayout::Layer& l, const Stash& s, const bf16* qkv) const {
  const Side& g = l.decoder ? s.dec : s.enc;
  const int64_t C = config().hidden;
  cuda::T5AttentionArgs a;
  a.q = qkv;
  a.k = qkv + C;
  a.v = qkv + 2 * C;
  a.ldq = a.ldkv = 3 * C;
  a.seg_q = a.seg_k = g.segments;
  a.key_ranges = g.keys;
  a.query_ranges = g.queries;
  a.B = g.rows;
  a.Tq = a.Tk = g.seq;
  a.C = C;
  a.NH = config().heads;
  a.causal = l.decoder;
  a.scale = 1.0f;  // T5 does not scale its scores
  a.bias = W(l.decoder ? layout_.dec_rel() : layout_.enc_rel());
  a.bucket_of = g.buckets;
  a.buckets = config().relative_buckets;
  return a;
}

cuda::T5AttentionArgs CudaT5Stage::CrossAttention(const Stash& s, const bf16* q, const bf16* kv) const {
  const int64_t C = config().hidden;
  cuda::T5AttentionArgs a;
  a.q = q;
  a.ldq = C;
  a.k = kv;
  a.v = kv + C;
  a.ldkv = 2 * C;
  a.seg_q = s.dec.segments;
  a.seg_k = s.enc.segments;
  a.key_ranges = s.cross_keys;
  a.query_ranges = s.cross_queries;
  a.B = s.dec.rows;
  a.Tq = s.dec.seq;
  a.Tk = s.enc.seq;
  a.C = C;
  a.NH = config().heads;
  return a;
}

absl::Status CudaT5Stage::LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, bf16* out) {
  const Side& g = l.decoder ? s.dec : s.enc;
  const int64_t N = g.n(), C = config().hidden, F = config().ffn, NH = config().heads;
  cudaStream_t st = stream_;
  ASSIGN_OR_RETURN(a.ln1, GetBf16(N * C));
  ASSIGN_OR_RETURN(a.mean1, GetF32(N));
  ASSIGN_OR_RETURN(a.rstd1, GetF32(N));
  RETURN_IF_ERROR(NormForward(a.ln1.as<bf16>(), a.mean1.as<float>(), a.rstd1.as<float>(), a.x.as<const bf16>(),
                              l.ln1_w, l.ln1_b, N));
  ASSIGN_OR_RETURN(a.qkv, GetBf16(N * 3 * C));
  RETURN_IF_ERROR(matmul_->Forward(a.qkv.as<bf16>(), a.ln1.as<const bf16>(), W(l.qkv_w), W(l.qkv_b), N, C, 3 * C, st));
  ASSIGN_OR_RETURN(a.atty, GetBf16(N * C));
  ASSIGN_OR_RETURN(a.lse, GetF32(N * NH));
  RETURN_IF_ERROR(cuda::T5AttentionForward(SelfAttention(l, s, a.qkv.as<const bf16>()), a.atty.as<bf16>(),
                                           a.lse.as<float>(), st));
  ASSIGN_OR_RETURN(a.x1, GetBf16(N * C));
  RETURN_IF_ERROR(matmul_->ForwardResidual(a.x1.as<bf16>(), a.atty.as<const bf16>(), W(l.proj_w), W(l.proj_b),
                                           a.x.as<const bf16>(), N, C, C, st));
  if (l.decoder) {  // x2 = x1 + xproj(cross(q(norm3(x1)), kv(enc_out)))
    const int64_t Ne = s.enc.n();
    ASSIGN_OR_RETURN(a.ln3, GetBf16(N * C));
    ASSIGN_OR_RETURN(a.mean3, GetF32(N));
    ASSIGN_OR_RETURN(a.rstd3, GetF32(N));
    RETURN_IF_ERROR(NormForward(a.ln3.as<bf16>(), a.mean3.as<float>(), a.rstd3.as<float>(), a.x1.as<const bf16>(),
                                l.ln3_w, GptLayout::kAbsent, N));
    ASSIGN_OR_RETURN(a.q, GetBf16(N * C));
    RETURN_IF_ERROR(matmul_->Forward(a.q.as<bf16>(), a.ln3.as<const bf16>(), W(l.xq_w), nullptr, N, C, C, st));
    ASSIGN_OR_RETURN(a.kv, GetBf16(Ne * 2 * C));
    RETURN_IF_ERROR(
        matmul_->Forward(a.kv.as<bf16>(), s.enc_out.as<const bf16>(), W(l.xkv_w), nullptr, Ne, C, 2 * C, st));
    ASSIGN_OR_RETURN(a.xy, GetBf16(N * C));
    ASSIGN_OR_RETURN(a.xlse, GetF32(N * NH));
    RETURN_IF_ERROR(cuda::T5AttentionForward(CrossAttention(s, a.q.as<const bf16>(), a.kv.as<const bf16>()),
                                             a.xy.as<bf16>(), a.xlse.as<float>(), st));
    ASSIGN_OR_RETURN(a.x2, GetBf16(N * C));
    RETURN_IF_ERROR(matmul_->ForwardResidual(a.x2.as<bf16>(), a.xy.as<const bf16>(), W(l.xproj_w), nullptr,
                                             a.x1.as<const bf16>(), N, C, C, st));
  }
  const bf16* h = a.mlp_in().as<const bf16>();
  ASSIGN_OR_RETURN(a.ln2, GetBf16(N * C));
  ASSIGN_OR_RETURN(a.mean2, GetF32(N));
  ASSIGN_OR_RETURN(a.rstd2, GetF32(N));
  RETURN_IF_ERROR(NormForward(a.ln2.as<bf16>(), a.mean2.as<float>(), a.rstd2.as<float>(), h, l.ln2_w, l.ln2_b, N));
  ASSIGN_OR_RETURN(a.fc, GetBf16(N * config().MlpWidth()));
  ASSIGN_OR_RETURN(a.act, GetBf16(N * F));
  RETURN_IF_ERROR(MlpForward(l, a.ln2.as<const bf16>(), a.fc.as<bf16>(), a.act.as<bf16>(), N));
  if (out == nullptr) return absl::OkStatus();
  return matmul_->ForwardResidual(out, a.act.as<const bf16>(), W(l.mproj_w), W(l.mproj_b), h, N, F, C, st);
}

absl::Status CudaT5Stage::LayerBackward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, bf16* dr,
                                        bf16* denc, LayerGrads& g) {
  const Side& side = l.decoder ? s.dec : s.enc;
  const int64_t N = side.n(), C = config().hidden;
  cudaStream_t st = stream_;
  // kFull: the whole layer again from its input (the same kernels on the
  // same values), without its output product.
  if (a.ln1.empty()) RETURN_IF_ERROR(LayerForward(l, a, s, nullptr));
  const bf16* h = a.mlp_in().as<const bf16>();
  RETURN_IF_ERROR(MlpBackward(l, a.ln2.as<const bf16>(), a.fc.as<const bf16>(), a.act.as<const bf16>(), dr,
                              g.dF.as<bf16>(), g.dfc.as<bf16>(), g.dln.as<bf16>(), N));
  RETURN_IF_ERROR(NormBackward(dr, l.ln2_w, l.ln2_b, g.dln.as<const bf16>(), h, a.mean2.as<const float>(),
                               a.rstd2.as<const float>(), N));
  if (l.decoder) {
    const int64_t Ne = s.enc.n();
    const size_t nc = static_cast<size_t>(N * C) * kBf16;
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.dxy.data(), 0, nc, st));
    RETURN_IF_ERROR(matmul_->Backward(g.dxy.as<bf16>(), G(l.xproj_w), nullptr, dr, a.xy.as<const bf16>(),
                                      W(l.xproj_w), N, C, C, st));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.dq.data(), 0, nc, st));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.dkv.data(), 0, static_cast<size_t>(Ne * 2 * C) * kBf16, st));
    RETURN_IF_ERROR(cuda::T5AttentionBackward(CrossAttention(s, a.q.as<const bf16>(), a.kv.as<const bf16>()),
                                              a.xy.as<const bf16>(), a.xlse.as<const float>(), g.dxy.as<const bf16>(),
                                              g.dq.as<bf16>(), g.dkv.as<bf16>(), g.dkv.as<bf16>() + C, nullptr,
                                              g.scratch.as<float>(), st));
    RETURN_IF_ERROR(matmul_->Backward(denc, G(l.xkv_w), nullptr, g.dkv.as<const bf16>(), s.enc_out.as<const bf16>(),
                                      W(l.xkv_w), Ne, C, 2 * C, st));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.dln.data(), 0, nc, st));
    RETURN_IF_ERROR(matmul_->Backward(g.dln.as<bf16>(), G(l.xq_w), nullptr, g.dq.as<const bf16>(),
                                      a.ln3.as<const bf16>(), W(l.xq_w), N, C, C, st));
    RETURN_IF_ERROR(NormBackward(dr, l.ln3_w, GptLayout::kAbsent, g.dln.as<const bf16>(), a.x1.as<const bf16>(),
                                 a.mean3.as<const float>(), a.rstd3.as<const float>(), N));
  }
  // Self-attention: x1 = x + proj(attention(qkv(norm1(x)))).
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.datty.data(), 0, static_cast<size_t>(N * C) * kBf16, st));
  RETURN_IF_ERROR(matmul_->Backward(g.datty.as<bf16>(), G(l.proj_w), G(l.proj_b), dr, a.atty.as<const bf16>(),
                                    W(l.proj_w), N, C, C, st));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.dqkv.data(), 0, static_cast<size_t>(N * 3 * C) * kBf16, st));
  bf16* dqkv = g.dqkv.as<bf16>();
  const cuda::T5AttentionArgs att = SelfAttention(l, s, a.qkv.as<const bf16>());
  float* dbias = att.bias == nullptr ? nullptr : G(l.decoder ? layout_.dec_rel() : layout_.enc_rel());
  RETURN_IF_ERROR(cuda::T5AttentionBackward(att, a.atty.as<const bf16>(), a.lse.as<const float>(),
                                            g.datty.as<const bf16>(), dqkv, dqkv + C, dqkv + 2 * C, dbias,
                                            g.scratch.as<float>(), st));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.dln.data(), 0, static_cast<size_t>(N * C) * kBf16, st));
  RETURN_IF_ERROR(matmul_->Backward(g.dln.as<bf16>(), G(l.qkv_w), G(l.qkv_b), g.dqkv.as<const bf16>(),
                                    a.ln1.as<const bf16>(), W(l.qkv_w), N, C, 3 * C, st));
  return NormBackward(dr, l.ln1_w, l.ln1_b, g.dln.as<const bf16>(), a.x.as<const bf16>(), a.mean1.as<const float>(),
                      a.rstd1.as<const float>(), N);
}

absl::Status CudaT5Stage::Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) {
  auto it = stash_.find(mb);
  if (it == stash_.end()) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " is not in flight"));
  const auto* dout = static_cast<const bf16*>(dhidden_out);
  auto* din = static_cast<bf16*>(dhidden_in);
  const StageOptions& o = options();
  if (!o.last && dout == nullptr) return absl::InvalidArgumentError("stage output gradient: missing");
  if (!o.first && din == nullptr) return absl::InvalidArgumentError("stage input gradient: missing");
  std::unique_ptr<Stash> owned = std::move(it->second);
  stash_.erase(it);
  Stash& s = *owned;
  const int64_t C = config().hidden, Ne = s.enc.n(), Nd = s.dec.n();
  const int E = config().num_layers, lo = o.first_layer, hi = lo + o.num_layers;
  const size_t enc_bytes = static_cast<size_t>(Ne * C) * kBf16, dec_bytes = static_cast<size_t>(Nd * C) * kBf16;
  // The output's gradient: the current stack's (dr) and, from the encoder's
  // end on, the encoder output's (denc), which every decoder layer adds to.
  Buffer dr, denc;
  if (hi >= E) {
    ASSIGN_OR_RETURN(denc, GetBf16(Ne * C));
    RETURN_IF_ERROR(Zero(denc));
  }
  if (o.last) {
    ASSIGN_OR_RETURN(dr, GetBf16(Nd * C));
    RETURN_IF_ERROR(Zero(dr));
    RETURN_IF_ERROR(HeadBackward(s, dr.as<bf16>()));
  } else if (hi < E) {
    ASSIGN_OR_RETURN(dr, GetBf16(Ne * C));
    RETURN_IF_ERROR(CopyD2D(dr.data(), dout, enc_bytes));
  } else {
    RETURN_IF_ERROR(CopyD2D(denc.data(), dout, enc_bytes));
    if (hi > E) {
      ASSIGN_OR_RETURN(dr, GetBf16(Nd * C));
      RETURN_IF_ERROR(CopyD2D(dr.data(), dout + Ne * C, dec_bytes));
    }
  }
  LayerGrads g;
  const int64_t N = std::max(lo < E ? Ne : 0, hi > E ? Nd : 0), NH = config().heads;
  ASSIGN_OR_RETURN(g.dF, GetBf16(N * config().ffn));
  ASSIGN_OR_RETURN(g.dfc, GetBf16(N * config().MlpWidth()));
  ASSIGN_OR_RETURN(g.dln, GetBf16(N * C));
  ASSIGN_OR_RETURN(g.datty, GetBf16(N * C));
  ASSIGN_OR_RETURN(g.dqkv, GetBf16(N * 3 * C));
  ASSIGN_OR_RETURN(g.scratch, GetF32(N * NH));
  if (hi > E) {
    ASSIGN_OR_RETURN(g.dxy, GetBf16(Nd * C));
    ASSIGN_OR_RETURN(g.dq, GetBf16(Nd * C));
    ASSIGN_OR_RETURN(g.dkv, GetBf16(Ne * 2 * C));
  }
  const std::vector<GptLayout::Layer>& layers = layout_.layers();
  for (int i = hi; i-- > lo;) {
    if (i == E - 1) {  // through the encoder's final norm into its last layer
      ASSIGN_OR_RETURN(dr, GetBf16(Ne * C));
      RETURN_IF_ERROR(Zero(dr));
      RETURN_IF_ERROR(NormBackward(dr.as<bf16>(), layout_.enc_lnf_w(), GptLayout::kAbsent, denc.as<const bf16>(),
                                   s.enc_last.as<const bf16>(), s.enc_mean.as<const float>(),
                                   s.enc_rstd.as<const float>(), Ne));
    }
    RETURN_IF_ERROR(LayerBackward(layers[i - lo], s.layers[i - lo], s, dr.as<bf16>(), denc.as<bf16>(), g));
    s.layers[i - lo] = LayerActs{};  // back to the pool early (stream-ordered reuse)
    if (i == E) {
      RETURN_IF_ERROR(cuda::EmbeddingBackward(G(layout_.wte()), nullptr, dr.as<const bf16>(), s.dec.tokens, nullptr,
                                              Nd, C, stream_));
    }
  }
  // The input's gradient, laid out as the previous stage's output.
  if (o.first) {
    RETURN_IF_ERROR(cuda::EmbeddingBackward(G(layout_.wte()), nullptr, dr.as<const bf16>(), s.enc.tokens, nullptr,
                                            Ne, C, stream_));
  } else if (lo < E) {
    RETURN_IF_ERROR(CopyD2D(din, dr.data(), enc_bytes));
  } else {
    RETURN_IF_ERROR(CopyD2D(din, denc.data(), enc_bytes));
    if (lo > E) RETURN_IF_ERROR(CopyD2D(din + Ne * C, dr.data(), dec_bytes));
  }
  return ready ? ready(0, layout_.num_params()) : absl::OkStatus();
}

}  // namespace dynapipe::runtime::model
