// CudaGptStage: forward (training and inference) and backward passes.

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/elementwise.h"
#include "runtime/kernels/cuda/embedding.h"
#include "runtime/kernels/cuda/gelu.h"
#include "runtime/kernels/cuda/layernorm.h"
#include "runtime/kernels/cuda/qkv.h"
#include "runtime/model/gpt_cuda.h"
#include "runtime/model/gpt_cuda_stash.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cuda = ::dynapipe::runtime::cuda;
using bf16 = __nv_bfloat16;

namespace {

constexpr size_t kBf16 = sizeof(bf16);
// Offsets of the int32 regions in Stash::ints: 256-byte multiples.
constexpr int64_t kIntAlign = 64;
int64_t AlignInts(int64_t n) { return (n + kIntAlign - 1) / kIntAlign * kIntAlign; }

}  // namespace

// Gradient scratch of a layer's backward, shared by every layer of the stage.
struct CudaGptStage::LayerGrads {
  Buffer dF;     // (N, F) bf16
  Buffer dfc;    // (N, MlpWidth()) bf16: the first product's output gradient, where no epilogue takes it
  Buffer dln;    // (N, C) bf16
  Buffer datty;  // (N, C) bf16
  Buffer dqkv;   // (N, 3C) bf16: the attention's input gradient
  Buffer dqkv_grouped;  // (N, QkvWidth()) bf16: the qkv product's (grouped-query attention only)
};

absl::Status CudaGptStage::LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, bf16* out) {
  const int64_t B = s.rows, T = s.seq, N = B * T, C = config().hidden, F = config().ffn, NH = config().heads;
  cudaStream_t st = stream_;
  ASSIGN_OR_RETURN(a.ln1, GetBf16(N * C));
  ASSIGN_OR_RETURN(a.ln1_mean, GetF32(N));
  ASSIGN_OR_RETURN(a.ln1_rstd, GetF32(N));
  RETURN_IF_ERROR(NormForward(a.ln1.as<bf16>(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), a.x.as<const bf16>(),
                              l.ln1_w, l.ln1_b, N));
  RETURN_IF_ERROR(QkvForward(l, a, s));
  ASSIGN_OR_RETURN(a.atty, GetBf16(N * C));
  ASSIGN_OR_RETURN(a.lse, GetF32(B * NH * T));
  RETURN_IF_ERROR(AttentionForward(a, s));
  // Residual adds in the products' epilogues (C = the residual, one rounding).
  ASSIGN_OR_RETURN(a.x2, GetBf16(N * C));
  RETURN_IF_ERROR(matmul_->ForwardResidual(a.x2.as<bf16>(), a.atty.as<const bf16>(), W(l.proj_w), W(l.proj_b),
                                           a.x.as<const bf16>(), N, C, C, st));
  ASSIGN_OR_RETURN(a.ln2, GetBf16(N * C));
  ASSIGN_OR_RETURN(a.ln2_mean, GetF32(N));
  ASSIGN_OR_RETURN(a.ln2_rstd, GetF32(N));
  RETURN_IF_ERROR(NormForward(a.ln2.as<bf16>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                              a.x2.as<const bf16>(), l.ln2_w, l.ln2_b, N));
  ASSIGN_OR_RETURN(a.fc, GetBf16(N * config().MlpWidth()));
  ASSIGN_OR_RETURN(a.gelu, GetBf16(N * F));
  RETURN_IF_ERROR(MlpForward(l, a.ln2.as<const bf16>(), a.fc.as<bf16>(), a.gelu.as<bf16>(), N));
  if (out != nullptr) {
    RETURN_IF_ERROR(matmul_->ForwardResidual(out, a.gelu.as<const bf16>(), W(l.mproj_w), W(l.mproj_b),
                                             a.x2.as<const bf16>(), N, F, C, st));
  }
  return absl::OkStatus();
}

absl::Status CudaGptStage::QkvForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s) {
  const int64_t N = s.rows * s.seq, C = config().hidden, QKV = config().QkvWidth();
  ASSIGN_OR_RETURN(a.qkv, GetBf16(N * 3 * C));
  // Grouped: the product into a buffer of its own (back to the pool once
  // expanded, stream-ordered); otherwise straight into what attention reads.
  Buffer grouped;
  bf16* qkv = a.qkv.as<bf16>();
  if (Grouped()) {
    ASSIGN_OR_RETURN(grouped, GetBf16(N * QKV));
    qkv = grouped.as<bf16>();
  }
  RETURN_IF_ERROR(matmul_->Forward(qkv, a.ln1.as<const bf16>(), W(l.qkv_w), W(l.qkv_b), N, C, QKV, stream_));
  RETURN_IF_ERROR(Rotate(qkv, s, /*inverse=*/false));  // kept rotated, as attention reads them (the CPU's too)
  if (!Grouped()) return absl::OkStatus();
  return cuda::ExpandKvHeads(a.qkv.as<bf16>(), qkv, N, C, config().heads, config().KvHeads(), stream_);
}

absl::StatusOr<const bf16*> CudaGptStage::QkvGradient(LayerGrads& g, const Stash& s) {
  const int64_t N = s.rows * s.seq, C = config().hidden;
  bf16* d = g.dqkv.as<bf16>();
  if (Grouped()) {
    RETURN_IF_ERROR(cuda::ReduceKvHeads(g.dqkv_grouped.as<bf16>(), d, N, C, config().heads, config().KvHeads(),
                                        stream_));
    d = g.dqkv_grouped.as<bf16>();
  }
  RETURN_IF_ERROR(Rotate(d, s, /*inverse=*/true));
  return d;
}

absl::Status CudaGptStage::Rotate(bf16* qkv, const Stash& s, bool inverse) {
  if (!config().rotary) return absl::OkStatus();
  return cuda::RotaryApply(qkv, s.positions, s.rows * s.seq, config().QkvWidth(), config().heads + config().KvHeads(),
                           config().HeadSize(), config().rope_base, inverse, stream_);
}

absl::StatusOr<std::unique_ptr<CudaGptStage::Stash>> CudaGptStage::RunForward(const TokenBatch& batch,
                                                                              const bf16* hidden_in, bf16* hidden_out,
                                                                              Recompute recompute) {
  const StageOptions& o = options();
  RETURN_IF_ERROR(CheckTokenBatch(batch, config()));
  if (!o.first && hidden_in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (!o.last && hidden_out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  if (!o.last && !layout_.layers().empty() && !Aligned16(hidden_out)) {
    return absl::InvalidArgumentError("stage output: not 16-byte aligned");  // written by cuBLASLt
  }
  const int64_t B = batch.rows, T = batch.seq, N = B * T, C = config().hidden;
  cudaStream_t st = stream_;
  auto s = std::make_unique<Stash>();
  s->rows = B;
  s->seq = T;
  RETURN_IF_ERROR(UploadTokens(batch, *s));
  RETURN_IF_ERROR(PrepareCudnnBatch(batch, *s));

  ASSIGN_OR_RETURN(Buffer x, GetBf16(N * C));
  if (o.first) {
    // Without a position table (rotary positions) the token's row alone.
    const int32_t* positions = layout_.wpe() == GptLayout::kAbsent ? nullptr : s->positions;
    RETURN_IF_ERROR(cuda::EmbeddingForward(x.as<bf16>(), s->tokens, positions, W(layout_.wte()), W(layout_.wpe()), N,
                                           C, st));
  } else {
    // Copied, as on the CPU: the plan may reuse the input's slot afterwards.
    RETURN_IF_ERROR(CopyD2D(x.data(), hidden_in, static_cast<size_t>(N * C) * kBf16));
  }
  RETURN_IF_ERROR(LayersForward(*s, x, hidden_out, recompute));
  if (o.last) RETURN_IF_ERROR(FinalNormForward(*s, x));
  return s;
}

absl::Status CudaGptStage::UploadTokens(const TokenBatch& batch, Stash& s) {
  const StageOptions& o = options();
  const int64_t N = batch.rows * batch.seq;
  // Token-level int32 inputs, positions on every stage (rotary positions
  // rotate in every layer), one upload from pageable memory (a first version:
  // pinned staging would make it truly asynchronous). CUDA stages a pageable
  // host -> device copy before cudaMemcpyAsync returns; the source is kept
  // with the stash all the same, so the upload does not depend on that.
  std::vector<int32_t> scored, targets;
  if (o.last) {
    for (int64_t k = 0; k < N; ++k) {
      if (batch.targets[k] >= 0) {
        scored.push_back(static_cast<int32_t>(k));
        targets.push_back(batch.targets[k]);
      }
    }
  }
  const int64_t M = static_cast<int64_t>(scored.size());
  s.scored_count = M;
  const int64_t o_pos = AlignInts(N), o_seg = o_pos + AlignInts(N), o_scored = o_seg + AlignInts(N),
                o_targets = o_scored + AlignInts(M), total = o_targets + AlignInts(M);
  std::vector<int32_t> ints(static_cast<size_t>(total), 0);
  std::copy(batch.tokens.begin(), batch.tokens.end(), ints.begin());
  std::copy(batch.positions.begin(), batch.positions.end(), ints.begin() + o_pos);
  std::copy(batch.segments.begin(), batch.segments.end(), ints.begin() + o_seg);
  std::copy(scored.begin(), scored.end(), ints.begin() + o_scored);
  std::copy(targets.begin(), targets.end(), ints.begin() + o_targets);
  ASSIGN_OR_RETURN(s.ints, Get(ints.size() * sizeof(int32_t)));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s.ints.data(), ints.data(), ints.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  s.host_ints = std::move(ints);
  const int32_t* dints = s.ints.as<const int32_t>();
  s.tokens = dints;
  s.positions = dints + o_pos;
  s.segments = dints + o_seg;
  s.scored = dints + o_scored;
  s.targets = dints + o_targets;
  return absl::OkStatus();
}

absl::Status CudaGptStage::LayersForward(Stash& s, Buffer& x, bf16* hidden_out, Recompute recompute) {
  const StageOptions& o = options();
  const int64_t N = s.rows * s.seq, C = config().hidden;
  const std::vector<GptLayout::Layer>& layers = layout_.layers();
  s.layers.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerActs& a = s.layers[i];
    a.x = std::move(x);
    // The last layer of a stage that is not the last writes the stage output.
    const bool to_output = i + 1 == layers.size() && !o.last;
    Buffer next;
    bf16* out;
    if (to_output) {
      out = hidden_out;
    } else {
      ASSIGN_OR_RETURN(next, GetBf16(N * C));
      out = next.as<bf16>();
    }
    RETURN_IF_ERROR(LayerForward(layers[i], a, s, out));
    // kSelective keeps everything: the attention's stash is its lse already.
    if (recompute == Recompute::kFull) {
      Buffer keep = std::move(a.x);
      a = LayerActs{};  // back to the pool (stream-ordered reuse)
      a.x = std::move(keep);
    }
    x = std::move(next);
  }
  if (layers.empty() && !o.last) {
    RETURN_IF_ERROR(CopyD2D(hidden_out, x.data(), static_cast<size_t>(N * C) * kBf16));
  }
  return absl::OkStatus();
}

absl::Status CudaGptStage::FinalNormForward(Stash& s, const Buffer& x) {
  const int64_t M = s.scored_count, C = config().hidden;
  if (M == 0) return absl::OkStatus();
  cudaStream_t st = stream_;
  ASSIGN_OR_RETURN(s.xs, GetBf16(M * C));
  RETURN_IF_ERROR(cuda::GatherRows(s.xs.as<bf16>(), x.as<const bf16>(), s.scored, M, C, st));
  ASSIGN_OR_RETURN(s.lnf, GetBf16(M * C));
  ASSIGN_OR_RETURN(s.lnf_mean, GetF32(M));
  ASSIGN_OR_RETURN(s.lnf_rstd, GetF32(M));
  return NormForward(s.lnf.as<bf16>(), s.lnf_mean.as<float>(), s.lnf_rstd.as<float>(), s.xs.as<const bf16>(),
                     layout_.lnf_w(), layout_.lnf_b(), M);
}

absl::Status CudaGptStage::Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                                   float loss_scale, Recompute recompute) {
  if (stash_.contains(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " forwarded twice"));
  ASSIGN_OR_RETURN(std::unique_ptr<Stash> s,
                   RunForward(batch, static_cast<const bf16*>(hidden_in), static_cast<bf16*>(hidden_out), recompute));
  s->loss_scale = loss_scale;
  if (options().last) RETURN_IF_ERROR(HeadLoss(s->lnf.as<const bf16>(), s->targets, s->scored_count, loss_scale));
  stash_[mb] = std::move(s);
  return absl::OkStatus();
}

absl::Status CudaGptStage::Infer(const TokenBatch& batch, const void* hidden_in, void* out_v) {
  auto* out = static_cast<bf16*>(out_v);
  if (out == nullptr) return absl::InvalidArgumentError("Infer: output missing");
  if (!options().last) {
    // Keeps only layer inputs while it runs; the stash goes on return.
    return RunForward(batch, static_cast<const bf16*>(hidden_in), out, Recompute::kFull).status();
  }
  if (!Aligned16(out)) return absl::InvalidArgumentError("Infer: logits not 16-byte aligned");
  // Every position scored: the stash's final LayerNorm then holds all N rows
  // in token order, and the head runs over them.
  TokenBatch all = batch;
  for (int32_t& t : all.targets) t = std::max(t, 0);
  ASSIGN_OR_RETURN(std::unique_ptr<Stash> s,
                   RunForward(all, static_cast<const bf16*>(hidden_in), nullptr, Recompute::kFull));
  const int64_t N = batch.rows * batch.seq, C = config().hidden, V = config().vocab;
  if (s->scored_count != N) return absl::InternalError("Infer: not every position was scored");
  return matmul_->Forward(out, s->lnf.as<const bf16>(), W(layout_.head()), nullptr, N, C, V, stream_);
}

absl::Status CudaGptStage::Backward(int mb, const void* dhidden_out_v, void* dhidden_in_v, const GradsReady& ready) {
  const auto* dhidden_out = static_cast<const bf16*>(dhidden_out_v);
  auto* dhidden_in = static_cast<bf16*>(dhidden_in_v);
  const StageOptions& o = options();
  auto it = stash_.find(mb);
  if (it == stash_.end()) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " was not forwarded"));
  if (!o.last && dhidden_out == nullptr) return absl::InvalidArgumentError("output gradient: missing");
  if (!o.first && dhidden_in == nullptr) return absl::InvalidArgumentError("input gradient: missing");
  std::unique_ptr<Stash> s = std::move(it->second);
  stash_.erase(it);
  const int64_t N = s->rows * s->seq, C = config().hidden;
  cudaStream_t st = stream_;

  // Gradient of the residual stream (bf16), accumulated layer by layer downwards.
  ASSIGN_OR_RETURN(Buffer dres, GetBf16(N * C));
  if (o.last) {
    RETURN_IF_ERROR(Zero(dres));
    RETURN_IF_ERROR(HeadBackward(*s, dres.as<bf16>()));
  } else {
    RETURN_IF_ERROR(CopyD2D(dres.data(), dhidden_out, static_cast<size_t>(N * C) * kBf16));
  }
  RETURN_IF_ERROR(LayersBackward(*s, dres.as<bf16>()));
  if (o.first) {
    const int32_t* positions = layout_.wpe() == GptLayout::kAbsent ? nullptr : s->positions;
    RETURN_IF_ERROR(cuda::EmbeddingBackward(G(layout_.wte()), G(layout_.wpe()), dres.as<const bf16>(), s->tokens,
                                            positions, N, C, st));
  } else {
    RETURN_IF_ERROR(CopyD2D(dhidden_in, dres.data(), static_cast<size_t>(N * C) * kBf16));
  }
  if (ready) RETURN_IF_ERROR(ready(0, layout_.num_params()));
  return absl::OkStatus();
}

absl::Status CudaGptStage::HeadBackward(const Stash& s, bf16* dres) {
  const int64_t C = config().hidden, M = s.scored_count;
  if (M == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Buffer dlnf, GetBf16(M * C));
  RETURN_IF_ERROR(HeadLossBackward(s.lnf.as<const bf16>(), s.targets, M, s.loss_scale, dlnf.as<bf16>()));
  ASSIGN_OR_RETURN(Buffer dxs, GetBf16(M * C));
  RETURN_IF_ERROR(Zero(dxs));
  RETURN_IF_ERROR(NormBackward(dxs.as<bf16>(), layout_.lnf_w(), layout_.lnf_b(), dlnf.as<const bf16>(),
                               s.xs.as<const bf16>(), s.lnf_mean.as<const float>(), s.lnf_rstd.as<const float>(), M));
  return cuda::ScatterAddRows(dres, dxs.as<const bf16>(), s.scored, M, C, stream_);
}

absl::Status CudaGptStage::LayersBackward(Stash& s, bf16* dr) {
  const std::vector<GptLayout::Layer>& layers = layout_.layers();
  if (layers.empty()) return absl::OkStatus();
  const int64_t N = s.rows * s.seq, C = config().hidden, F = config().ffn;
  LayerGrads g;
  ASSIGN_OR_RETURN(g.dF, GetBf16(N * F));
  if (config().mlp != MlpKind::kGelu) {
    ASSIGN_OR_RETURN(g.dfc, GetBf16(N * config().MlpWidth()));
  }
  ASSIGN_OR_RETURN(g.dln, GetBf16(N * C));
  ASSIGN_OR_RETURN(g.datty, GetBf16(N * C));
  ASSIGN_OR_RETURN(g.dqkv, GetBf16(N * 3 * C));
  if (Grouped()) {
    ASSIGN_OR_RETURN(g.dqkv_grouped, GetBf16(N * config().QkvWidth()));
  }
  for (size_t i = layers.size(); i-- > 0;) {
    RETURN_IF_ERROR(LayerBackward(layers[i], s.layers[i], s, dr, g));
    s.layers[i] = LayerActs{};  // back to the pool early (stream-ordered reuse)
  }
  return absl::OkStatus();
}

absl::Status CudaGptStage::LayerBackward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, bf16* dr,
                                         LayerGrads& g) {
  const int64_t N = s.rows * s.seq, C = config().hidden;
  cudaStream_t st = stream_;
  // kFull: the whole layer again from its input (the same kernels on the
  // same values, so the same activations), without its output product.
  if (a.ln1.empty()) RETURN_IF_ERROR(LayerForward(l, a, s, nullptr));
  RETURN_IF_ERROR(MlpBackward(l, a.ln2.as<const bf16>(), a.fc.as<const bf16>(), a.gelu.as<const bf16>(), dr,
                              g.dF.as<bf16>(), g.dfc.as<bf16>(), g.dln.as<bf16>(), N));
  RETURN_IF_ERROR(NormBackward(dr, l.ln2_w, l.ln2_b, g.dln.as<const bf16>(), a.x2.as<const bf16>(),
                               a.ln2_mean.as<const float>(), a.ln2_rstd.as<const float>(), N));
  // Attention branch.
  RETURN_IF_ERROR(Zero(g.datty));
  RETURN_IF_ERROR(matmul_->Backward(g.datty.as<bf16>(), G(l.proj_w), G(l.proj_b), dr, a.atty.as<const bf16>(),
                                    W(l.proj_w), N, C, C, st));
  RETURN_IF_ERROR(Zero(g.dqkv));
  RETURN_IF_ERROR(AttentionBackward(g.dqkv.as<bf16>(), g.datty.as<const bf16>(), a, s));
  ASSIGN_OR_RETURN(const bf16* dqkv, QkvGradient(g, s));
  RETURN_IF_ERROR(Zero(g.dln));
  RETURN_IF_ERROR(matmul_->Backward(g.dln.as<bf16>(), G(l.qkv_w), G(l.qkv_b), dqkv, a.ln1.as<const bf16>(),
                                    W(l.qkv_w), N, C, config().QkvWidth(), st));
  return NormBackward(dr, l.ln1_w, l.ln1_b, g.dln.as<const bf16>(), a.x.as<const bf16>(),
                      a.ln1_mean.as<const float>(), a.ln1_rstd.as<const float>(), N);
}

}  // namespace dynapipe::runtime::model
