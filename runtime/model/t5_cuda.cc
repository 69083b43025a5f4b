// CudaT5Stage: creation, a micro-batch's inputs, the stage's forward and
// backward over its layers, the head. One layer is in t5_cuda_layers.cc.

#include "runtime/model/t5_cuda.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/attention_ranges.h"
#include "runtime/kernels/cuda/elementwise.h"
#include "runtime/kernels/cuda/embedding.h"
#include "runtime/model/t5_cuda_stash.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cuda = ::dynapipe::runtime::cuda;
using bf16 = __nv_bfloat16;

namespace {

constexpr size_t kBf16 = sizeof(bf16);

// The int32 arrays of one upload, each at a 256-byte aligned offset.
class IntPack {
 public:
  // Appends `v`; returns its offset in ints.
  int64_t Add(const std::vector<int32_t>& v) {
    const int64_t at = static_cast<int64_t>(ints_.size());
    ints_.insert(ints_.end(), v.begin(), v.end());
    ints_.resize((ints_.size() + 63) / 64 * 64, 0);
    return at;
  }
  std::vector<int32_t>& ints() { return ints_; }

 private:
  std::vector<int32_t> ints_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaT5Stage>> CudaT5Stage::Create(const GptConfig& config, const StageOptions& options,
                                                                 cudaStream_t compute_stream, BufferPool* pool,
                                                                 absl::Duration wait_timeout, CudaKernels kernels) {
  if (!config.encoder_decoder) return absl::InvalidArgumentError("CudaT5Stage: the model is not an encoder-decoder");
  if (config.rotary || config.KvHeads() != config.heads) {  // its attention reads rows of 3C, learned bias only
    return absl::InvalidArgumentError("CudaT5Stage: T5 has neither rotary positions nor grouped-query attention");
  }
  if (config.relative_buckets <= 0 || config.relative_buckets > cuda::kMaxT5Buckets) {
    return absl::InvalidArgumentError(absl::StrCat("model.relative_buckets: ", config.relative_buckets,
                                                   " is outside 1..", cuda::kMaxT5Buckets, " on the CUDA backend"));
  }
  ASSIGN_OR_RETURN(GptLayout layout, GptLayout::Make(config, options));
  RETURN_IF_ERROR(CheckCudaLayout(layout));
  if (pool == nullptr) return absl::InvalidArgumentError("CudaT5Stage: pool is null");
  std::unique_ptr<CudaT5Stage> stage(
      new CudaT5Stage(std::move(layout), compute_stream, pool, cuda::WaitSeconds(wait_timeout), kernels));
  RETURN_IF_ERROR(stage->Init("CudaT5Stage::Create"));
  return stage;
}

CudaT5Stage::CudaT5Stage(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
                         CudaKernels kernels)
    : CudaStageBase(std::move(layout), stream, pool, wait_timeout, kernels) {}

CudaT5Stage::~CudaT5Stage() = default;

absl::Status CudaT5Stage::Upload(const TokenBatch& batch, Stash& s) {
  const int E = config().num_layers, lo = options().first_layer, hi = lo + options().num_layers;
  const bool has_enc = lo < E, has_dec = hi > E;
  const bool whole_rows = config().attention == AttentionKernel::kMaterialized;
  const int64_t B = batch.rows, Te = batch.enc_seq, Td = batch.seq;
  s.enc.rows = s.dec.rows = B;
  s.enc.seq = Te;
  s.dec.seq = Td;
  IntPack pack;
  const int64_t enc_tokens = pack.Add(batch.enc_tokens), enc_seg = pack.Add(batch.enc_segments);
  const int64_t dec_tokens = pack.Add(batch.tokens), dec_seg = pack.Add(batch.segments);
  int64_t enc_keys = -1, enc_queries = -1, enc_buckets = -1, dec_keys = -1, dec_queries = -1, dec_buckets = -1;
  int64_t cross_keys = -1, cross_queries = -1;
  const int buckets = config().relative_buckets, distance = config().relative_max_distance;
  if (has_enc) {
    cuda::AttentionRanges r = cuda::MakeAttentionRanges(batch.enc_segments.data(), batch.enc_segments.data(), B, Te,
                                                        Te, false, whole_rows);
    enc_keys = pack.Add(r.keys);
    enc_queries = pack.Add(r.queries);
    enc_buckets = pack.Add(cuda::RelativeBucketTable(Te, Te, true, buckets, distance));
  }
  if (has_dec) {
    cuda::AttentionRanges r =
        cuda::MakeAttentionRanges(batch.segments.data(), batch.segments.data(), B, Td, Td, true, whole_rows);
    dec_keys = pack.Add(r.keys);
    dec_queries = pack.Add(r.queries);
    dec_buckets = pack.Add(cuda::RelativeBucketTable(Td, Td, false, buckets, distance));
    cuda::AttentionRanges x =
        cuda::MakeAttentionRanges(batch.segments.data(), batch.enc_segments.data(), B, Td, Te, false, whole_rows);
    cross_keys = pack.Add(x.keys);
    cross_queries = pack.Add(x.queries);
  }
  std::vector<int32_t> scored, targets;
  if (options().last) {
    for (int64_t k = 0; k < B * Td; ++k) {
      if (batch.targets[k] >= 0) {
        scored.push_back(static_cast<int32_t>(k));
        targets.push_back(batch.targets[k]);
      }
    }
  }
  s.scored_count = static_cast<int64_t>(scored.size());
  const int64_t scored_at = pack.Add(scored), targets_at = pack.Add(targets);
  s.host_ints = std::move(pack.ints());
  ASSIGN_OR_RETURN(s.ints, Get(s.host_ints.size() * sizeof(int32_t)));
  // Pageable source, kept with the stash (as CudaGptStage's upload).
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.ints.data(), s.host_ints.data(), s.host_ints.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  const int32_t* d = s.ints.as<const int32_t>();
  auto at = [d](int64_t offset) { return offset < 0 ? nullptr : d + offset; };
  s.enc.tokens = at(enc_tokens);
  s.enc.segments = at(enc_seg);
  s.enc.keys = at(enc_keys);
  s.enc.queries = at(enc_queries);
  s.enc.buckets = at(enc_buckets);
  s.dec.tokens = at(dec_tokens);
  s.dec.segments = at(dec_seg);
  s.dec.keys = at(dec_keys);
  s.dec.queries = at(dec_queries);
  s.dec.buckets = at(dec_buckets);
  s.cross_keys = at(cross_keys);
  s.cross_queries = at(cross_queries);
  s.scored = at(scored_at);
  s.targets = at(targets_at);
  return absl::OkStatus();
}

// The stage's input (GptConfig::BoundaryElements): the encoder's tokens on
// the first stage; inside the encoder its hidden state; from its end on the
// encoder output, then (past it) the decoder's hidden state. *x: the
// current stack's hidden state (empty where the decoder starts here).
absl::Status CudaT5Stage::StageInput(Stash& s, const bf16* in, Buffer* x) {
  const int64_t C = config().hidden, Ne = s.enc.n(), Nd = s.dec.n();
  const int E = config().num_layers, lo = options().first_layer;
  if (options().first) {
    ASSIGN_OR_RETURN(*x, GetBf16(Ne * C));
    return cuda::EmbeddingForward(x->as<bf16>(), s.enc.tokens, nullptr, W(layout_.wte()), nullptr, Ne, C, stream_);
  }
  // Copied, as on the CPU: the plan may reuse the input's slot afterwards.
  if (lo < E) {
    ASSIGN_OR_RETURN(*x, GetBf16(Ne * C));
    return CopyD2D(x->data(), in, static_cast<size_t>(Ne * C) * kBf16);
  }
  ASSIGN_OR_RETURN(s.enc_out, GetBf16(Ne * C));
  RETURN_IF_ERROR(CopyD2D(s.enc_out.data(), in, static_cast<size_t>(Ne * C) * kBf16));
  if (lo == E) return absl::OkStatus();
  ASSIGN_OR_RETURN(*x, GetBf16(Nd * C));
  return CopyD2D(x->data(), in + Ne * C, static_cast<size_t>(Nd * C) * kBf16);
}

absl::StatusOr<std::unique_ptr<CudaT5Stage::Stash>> CudaT5Stage::RunForward(const TokenBatch& batch, const bf16* in,
                                                                            bf16* out, Recompute recompute) {
  RETURN_IF_ERROR(CheckTokenBatch(batch, config()));
  const StageOptions& o = options();
  if (!o.first && in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (!o.last && out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  if (!o.last && !Aligned16(out)) return absl::InvalidArgumentError("stage output: not 16-byte aligned");
  const int E = config().num_layers, lo = o.first_layer, hi = lo + o.num_layers;
  if (o.last && hi <= E) return absl::InvalidArgumentError("the last stage holds no decoder layer");
  const int64_t C = config().hidden;
  auto owned = std::make_unique<Stash>();
  Stash& s = *owned;
  RETURN_IF_ERROR(Upload(batch, s));
  Buffer x;
  RETURN_IF_ERROR(StageInput(s, in, &x));
  const std::vector<GptLayout::Layer>& layers = layout_.layers();
  s.layers.resize(layers.size());
  for (int i = lo; i < hi; ++i) {
    const GptLayout::Layer& l = layers[i - lo];
    LayerActs& a = s.layers[i - lo];
    if (i == E) {  // the decoder starts: its embedded tokens
      ASSIGN_OR_RETURN(x, GetBf16(s.dec.n() * C));
      RETURN_IF_ERROR(cuda::EmbeddingForward(x.as<bf16>(), s.dec.tokens, nullptr, W(layout_.wte()), nullptr,
                                             s.dec.n(), C, stream_));
    }
    a.x = std::move(x);
    ASSIGN_OR_RETURN(x, GetBf16((l.decoder ? s.dec : s.enc).n() * C));
    RETURN_IF_ERROR(LayerForward(l, a, s, x.as<bf16>()));
    if (recompute == Recompute::kFull) {
      Buffer keep = std::move(a.x);
      a = LayerActs{};  // back to the pool (stream-ordered reuse)
      a.x = std::move(keep);
    }
    if (i == E - 1) {  // the encoder ends: its final norm gives what every decoder layer reads
      const int64_t Ne = s.enc.n();
      s.enc_last = std::move(x);
      ASSIGN_OR_RETURN(s.enc_mean, GetF32(Ne));
      ASSIGN_OR_RETURN(s.enc_rstd, GetF32(Ne));
      ASSIGN_OR_RETURN(s.enc_out, GetBf16(Ne * C));
      RETURN_IF_ERROR(NormForward(s.enc_out.as<bf16>(), s.enc_mean.as<float>(), s.enc_rstd.as<float>(),
                                  s.enc_last.as<const bf16>(), layout_.enc_lnf_w(), GptLayout::kAbsent, Ne));
    }
  }
  if (o.last) {
    RETURN_IF_ERROR(HeadForward(s, x));
    return owned;
  }
  // The stage's output, laid out as the next stage's input.
  const size_t enc_bytes = static_cast<size_t>(s.enc.n() * C) * kBf16;
  if (hi < E) {
    RETURN_IF_ERROR(CopyD2D(out, x.data(), enc_bytes));
  } else {
    RETURN_IF_ERROR(CopyD2D(out, s.enc_out.data(), enc_bytes));
    if (hi > E) RETURN_IF_ERROR(CopyD2D(out + s.enc.n() * C, x.data(), static_cast<size_t>(s.dec.n() * C) * kBf16));
  }
  return owned;
}

// The final norm of the scored target rows, scaled by hidden^-0.5 for a
// tied head (T5's), kept for the head's products.
absl::Status CudaT5Stage::HeadForward(Stash& s, const Buffer& x) {
  const int64_t M = s.scored_count, C = config().hidden;
  if (M == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(s.xs, GetBf16(M * C));
  RETURN_IF_ERROR(cuda::GatherRows(s.xs.as<bf16>(), x.as<const bf16>(), s.scored, M, C, stream_));
  ASSIGN_OR_RETURN(s.lnf, GetBf16(M * C));
  ASSIGN_OR_RETURN(s.lnf_mean, GetF32(M));
  ASSIGN_OR_RETURN(s.lnf_rstd, GetF32(M));
  RETURN_IF_ERROR(NormForward(s.lnf.as<bf16>(), s.lnf_mean.as<float>(), s.lnf_rstd.as<float>(), s.xs.as<const bf16>(),
                              layout_.lnf_w(), GptLayout::kAbsent, M));
  if (!config().tie_embeddings) return absl::OkStatus();
  return cuda::Scale(s.lnf.as<bf16>(), 1.0f / std::sqrt(static_cast<float>(C)), M * C, stream_);
}

absl::Status CudaT5Stage::Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                                  float loss_scale, Recompute recompute) {
  if (stash_.contains(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " is in flight"));
  ASSIGN_OR_RETURN(std::unique_ptr<Stash> s,
                   RunForward(batch, static_cast<const bf16*>(hidden_in), static_cast<bf16*>(hidden_out), recompute));
  s->loss_scale = loss_scale;
  if (options().last) RETURN_IF_ERROR(HeadLoss(s->lnf.as<const bf16>(), s->targets, s->scored_count, loss_scale));
  stash_[mb] = std::move(s);
  return absl::OkStatus();
}

absl::Status CudaT5Stage::Infer(const TokenBatch& batch, const void* hidden_in, void* out_v) {
  auto* out = static_cast<bf16*>(out_v);
  if (out == nullptr) return absl::InvalidArgumentError("Infer: output missing");
  if (!options().last) return RunForward(batch, static_cast<const bf16*>(hidden_in), out, Recompute::kFull).status();
  if (!Aligned16(out)) return absl::InvalidArgumentError("Infer: logits not 16-byte aligned");
  // Every position scored: the head's rows are then all of them, in order.
  TokenBatch all = batch;
  for (int32_t& t : all.targets) t = std::max(t, 0);
  ASSIGN_OR_RETURN(std::unique_ptr<Stash> s,
                   RunForward(all, static_cast<const bf16*>(hidden_in), nullptr, Recompute::kFull));
  const int64_t N = batch.rows * batch.seq, C = config().hidden, V = config().vocab;
  if (s->scored_count != N) return absl::InternalError("Infer: not every position was scored");
  return matmul_->Forward(out, s->lnf.as<const bf16>(), W(layout_.head()), nullptr, N, C, V, stream_);
}

// The head's backward (logits recomputed) into the scored rows of dr.
absl::Status CudaT5Stage::HeadBackward(const Stash& s, bf16* dr) {
  const int64_t C = config().hidden, M = s.scored_count;
  if (M == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Buffer dlnf, GetBf16(M * C));
  RETURN_IF_ERROR(HeadLossBackward(s.lnf.as<const bf16>(), s.targets, M, s.loss_scale, dlnf.as<bf16>()));
  if (config().tie_embeddings) {
    RETURN_IF_ERROR(cuda::Scale(dlnf.as<bf16>(), 1.0f / std::sqrt(static_cast<float>(C)), M * C, stream_));
  }
  ASSIGN_OR_RETURN(Buffer dxs, GetBf16(M * C));
  RETURN_IF_ERROR(Zero(dxs));
  RETURN_IF_ERROR(NormBackward(dxs.as<bf16>(), layout_.lnf_w(), GptLayout::kAbsent, dlnf.as<const bf16>(),
                               s.xs.as<const bf16>(), s.lnf_mean.as<const float>(), s.lnf_rstd.as<const float>(), M));
  return cuda::ScatterAddRows(dr, dxs.as<const bf16>(), s.scored, M, C, stream_);
}

}  // namespace dynapipe::runtime::model
