#include "runtime/model/gpt_cuda.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "runtime/backend/cuda/cast.h"
#include "runtime/backend/cuda/cross_entropy.h"
#include "runtime/backend/cuda/cuda_status.h"
#include "runtime/backend/cuda/device_memory.h"
#include "runtime/backend/cuda/elementwise.h"
#include "runtime/backend/cuda/embedding.h"
#include "runtime/backend/cuda/gelu.h"
#include "runtime/backend/cuda/layernorm.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cuda = ::dynapipe::runtime::cuda;
using bf16 = __nv_bfloat16;

// Values coming back to the host, in pinned memory so the copies are truly
// asynchronous and WaitStream bounds the wait.
struct CudaGptStage::HostScalars {
  float loss = 0;
  double sum_squares = 0;
};

// What backward needs from one micro-batch's forward (device buffers from the
// pool, on the compute stream). Mirrors GptStage::Stash, except that the
// attention keeps its log-sum-exp instead of the probabilities and the head's
// logits are not kept at all (recomputed in Backward, see there).
struct CudaGptStage::Stash {
  struct LayerActs {
    Buffer x;                        // layer input (N, C) bf16
    Buffer ln1, ln1_mean, ln1_rstd;  // (N, C) bf16, (N), (N) fp32
    Buffer qkv;                      // (N, 3C) bf16
    Buffer atty, lse;                // (N, C) bf16, (B, NH, T) fp32
    Buffer x2;                       // after the attention residual (N, C) bf16
    Buffer ln2, ln2_mean, ln2_rstd;  // as ln1
    Buffer fc, gelu;                 // (N, F) bf16 each
  };
  int64_t rows = 0, seq = 0;
  // Device int32: tokens, positions, segments (N each), then on the last
  // stage the scored token indices and their targets (M each).
  Buffer ints;
  // Its host source, kept until Backward (see Forward).
  std::vector<int32_t> host_ints;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
  const int32_t* scored = nullptr;
  const int32_t* targets = nullptr;
  std::vector<LayerActs> layers;
  // Last stage: only scored rows go through the head.
  int64_t scored_count = 0;                   // M
  Buffer xs, lnf, lnf_mean, lnf_rstd;         // (M, C), (M, C) bf16, (M), (M) fp32
  float loss_scale = 0;
};

namespace {

constexpr size_t kBf16 = sizeof(bf16), kF32 = sizeof(float);
// Offsets of the int32 regions in Stash::ints: 256-byte multiples.
constexpr int64_t kIntAlign = 64;
int64_t AlignInts(int64_t n) { return (n + kIntAlign - 1) / kIntAlign * kIntAlign; }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status Zero(const Buffer& b, cudaStream_t stream) {
  if (b.empty()) return absl::OkStatus();
  return cuda::CudaStatus(cudaMemsetAsync(b.data(), 0, b.bytes(), stream), "cudaMemsetAsync");
}

absl::Status CopyD2D(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  return cuda::CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync D2D");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaGptStage>> CudaGptStage::Create(const GptConfig& config,
                                                                   const GptStage::Options& options,
                                                                   cudaStream_t compute_stream, BufferPool* pool) {
  // Everything the kernels cannot run is rejected before touching the device.
  if (config.hidden <= 0 || config.heads <= 0 || config.hidden % config.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", config.heads, " does not divide model.hidden ", config.hidden));
  }
  const int hs = config.hidden / config.heads;
  if (hs != 32 && hs != 64 && hs != 128) {
    return absl::InvalidArgumentError(absl::StrCat("model.hidden / model.heads: head dimension ", hs,
                                                   " is not supported by the CUDA attention (32, 64 or 128)"));
  }
  if (config.ffn <= 0 || config.ffn % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.ffn: ", config.ffn, " must be a positive multiple of 8 on the CUDA backend (aligned parameters)"));
  }
  if (pool == nullptr) return absl::InvalidArgumentError("CudaGptStage: pool is null");
  std::unique_ptr<CudaGptStage> stage(new CudaGptStage(config, options, compute_stream, pool));
  RETURN_IF_ERROR(stage->Init());
  return stage;
}

CudaGptStage::CudaGptStage(const GptConfig& c, const GptStage::Options& o, cudaStream_t stream, BufferPool* pool)
    : config_(c),
      options_(o),
      stream_(stream),
      pool_(pool),
      attention_mode_(c.attention == cpu::AttentionKernel::kMaterialized ? cuda::AttentionMode::kMaterialized
                                                                         : cuda::AttentionMode::kVarlen) {}

absl::Status CudaGptStage::Init() {
  // The layout and the initial values come from a CPU stage built with the
  // same config and options, so both backends agree by construction. It costs
  // 8 bytes per parameter of host memory (weights and gradients) until Init
  // returns; its pool is never used (GptStage::Create allocates no
  // activations).
  BufferPool host_pool(CpuAllocator());
  ASSIGN_OR_RETURN(std::unique_ptr<GptStage> cpu_stage, GptStage::Create(config_, options_, &host_pool));
  params_ = cpu_stage->params();
  num_params_ = static_cast<int64_t>(cpu_stage->param_data().size());
  for (const ParamInfo& p : params_) {
    if (p.offset % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.name, ": offset ", p.offset, " is not a multiple of 8 elements"));
    }
  }
  auto offset = [&](const std::string& name) -> absl::StatusOr<size_t> {
    const ParamInfo* p = FindParam(name);
    if (p == nullptr) return absl::InternalError(absl::StrCat("CPU stage layout lacks ", name));
    return p->offset;
  };
  if (options_.first || (options_.last && config_.tie_embeddings)) {
    ASSIGN_OR_RETURN(wte_, offset("wte"));
  }
  if (options_.first) {
    ASSIGN_OR_RETURN(wpe_, offset("wpe"));
  }
  for (int i = 0; i < options_.num_layers; ++i) {
    const std::string p = absl::StrCat("h.", options_.first_layer + i, ".");
    Layer l;
    ASSIGN_OR_RETURN(l.ln1_w, offset(p + "ln1.w"));
    ASSIGN_OR_RETURN(l.ln1_b, offset(p + "ln1.b"));
    ASSIGN_OR_RETURN(l.qkv_w, offset(p + "attn.qkv.w"));
    ASSIGN_OR_RETURN(l.qkv_b, offset(p + "attn.qkv.b"));
    ASSIGN_OR_RETURN(l.proj_w, offset(p + "attn.proj.w"));
    ASSIGN_OR_RETURN(l.proj_b, offset(p + "attn.proj.b"));
    ASSIGN_OR_RETURN(l.ln2_w, offset(p + "ln2.w"));
    ASSIGN_OR_RETURN(l.ln2_b, offset(p + "ln2.b"));
    ASSIGN_OR_RETURN(l.fc_w, offset(p + "mlp.fc.w"));
    ASSIGN_OR_RETURN(l.fc_b, offset(p + "mlp.fc.b"));
    ASSIGN_OR_RETURN(l.mproj_w, offset(p + "mlp.proj.w"));
    ASSIGN_OR_RETURN(l.mproj_b, offset(p + "mlp.proj.b"));
    layers_.push_back(l);
  }
  if (options_.last) {
    ASSIGN_OR_RETURN(lnf_w_, offset("lnf.w"));
    ASSIGN_OR_RETURN(lnf_b_, offset("lnf.b"));
    if (config_.tie_embeddings) {
      head_ = wte_;
    } else {
      ASSIGN_OR_RETURN(head_, offset("lm_head.w"));
    }
  }

  // Device state.
  ASSIGN_OR_RETURN(matmul_, cuda::Matmul::Create());
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  void* host = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&host, sizeof(HostScalars)));
  host_ = new (host) HostScalars();
  const size_t P = static_cast<size_t>(num_params_);
  if (P > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&master_), P * kF32));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&compute_), P * kBf16));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&grads_), P * kF32));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&m_), P * kF32));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&v_), P * kF32));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grads_, 0, P * kF32, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m_, 0, P * kF32, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v_, 0, P * kF32, stream_));
  }
  // SetParams waits for the stream, so the CPU stage may go.
  return SetParams(cpu_stage->param_data());
}

CudaGptStage::~CudaGptStage() {
  // The stash's buffers return to the pool's stream cache (stream-ordered, so
  // they may go at once); the arrays and the cuBLASLt workspace only once the
  // queued work that reads them has finished.
  if (done_ != nullptr) {
    if (absl::Status s = WaitStream("destroying the stage"); !s.ok()) spdlog::error("CudaGptStage: {}", s.message());
  }
  stash_.clear();
  matmul_.reset();
  for (void* p : {static_cast<void*>(master_), static_cast<void*>(compute_), static_cast<void*>(grads_),
                  static_cast<void*>(m_), static_cast<void*>(v_)}) {
    if (p != nullptr) cudaFree(p);
  }
  if (host_ != nullptr) cudaFreeHost(host_);
  if (done_ != nullptr) cudaEventDestroy(done_);
}

const ParamInfo* CudaGptStage::FindParam(const std::string& name) const {
  for (const ParamInfo& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

Buffer CudaGptStage::Get(size_t bytes) { return pool_->Get(bytes, cuda::Handle(stream_)); }

absl::Status CudaGptStage::WaitStream(const char* what) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
  return cuda::WaitForEvent(done_, kHostWaitTimeout, what);
}

absl::Status CudaGptStage::ZeroGrads() {
  if (num_params_ == 0) return absl::OkStatus();
  return cuda::CudaStatus(cudaMemsetAsync(grads_, 0, static_cast<size_t>(num_params_) * kF32, stream_),
                          "ZeroGrads");
}

absl::StatusOr<double> CudaGptStage::Forward(int mb, const TokenBatch& batch, const bf16* hidden_in,
                                             bf16* hidden_out, float loss_scale) {
  if (stash_.contains(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " forwarded twice"));
  RETURN_IF_ERROR(CheckTokenBatch(batch, config_));
  if (!options_.first && hidden_in == nullptr) return absl::InvalidArgumentError("stage input: missing");
  if (!options_.last && hidden_out == nullptr) return absl::InvalidArgumentError("stage output: missing");
  if (!options_.last && !layers_.empty() && !Aligned16(hidden_out)) {
    return absl::InvalidArgumentError("stage output: not 16-byte aligned");
  }
  const int64_t B = batch.rows, T = batch.seq, N = B * T, C = config_.hidden, F = config_.ffn, V = config_.vocab,
                NH = config_.heads;
  cudaStream_t st = stream_;
  auto s = std::make_unique<Stash>();
  s->rows = B;
  s->seq = T;
  s->loss_scale = loss_scale;

  // Token-level int32 inputs, one upload from pageable memory (a first
  // version: pinned staging would make it truly asynchronous). CUDA stages a
  // pageable host -> device copy before cudaMemcpyAsync returns; the source
  // is kept in the stash until Backward all the same, so the upload does not
  // depend on that (the last stage also waits for the stream below).
  std::vector<int32_t> scored, targets;
  if (options_.last) {
    for (int64_t k = 0; k < N; ++k) {
      if (batch.targets[k] >= 0) {
        scored.push_back(static_cast<int32_t>(k));
        targets.push_back(batch.targets[k]);
      }
    }
  }
  const int64_t M = static_cast<int64_t>(scored.size());
  s->scored_count = M;
  const int64_t o_pos = AlignInts(N), o_seg = o_pos + AlignInts(N), o_scored = o_seg + AlignInts(N),
                o_targets = o_scored + AlignInts(M), total = o_targets + AlignInts(M);
  std::vector<int32_t> ints(static_cast<size_t>(total), 0);
  std::copy(batch.tokens.begin(), batch.tokens.end(), ints.begin());
  std::copy(batch.positions.begin(), batch.positions.end(), ints.begin() + o_pos);
  std::copy(batch.segments.begin(), batch.segments.end(), ints.begin() + o_seg);
  std::copy(scored.begin(), scored.end(), ints.begin() + o_scored);
  std::copy(targets.begin(), targets.end(), ints.begin() + o_targets);
  s->ints = Get(ints.size() * sizeof(int32_t));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s->ints.data(), ints.data(), ints.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  s->host_ints = std::move(ints);
  const int32_t* dints = s->ints.as<const int32_t>();
  s->tokens = dints;
  s->positions = dints + o_pos;
  s->segments = dints + o_seg;
  s->scored = dints + o_scored;
  s->targets = dints + o_targets;

  auto bf = [&](int64_t elements) { return Get(static_cast<size_t>(elements) * kBf16); };
  auto f32 = [&](int64_t elements) { return Get(static_cast<size_t>(elements) * kF32); };

  Buffer x = bf(N * C);
  if (options_.first) {
    RETURN_IF_ERROR(cuda::EmbeddingForward(x.as<bf16>(), s->tokens, s->positions, W(wte_), W(wpe_), N, C, st));
  } else {
    // Copied, as on the CPU: the plan may reuse the input's slot afterwards.
    RETURN_IF_ERROR(CopyD2D(x.data(), hidden_in, static_cast<size_t>(N * C) * kBf16, st));
  }
  s->layers.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    Stash::LayerActs& a = s->layers[i];
    a.x = std::move(x);
    a.ln1 = bf(N * C), a.ln1_mean = f32(N), a.ln1_rstd = f32(N);
    RETURN_IF_ERROR(cuda::LayerNormForward(a.ln1.as<bf16>(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(),
                                           a.x.as<const bf16>(), W(l.ln1_w), W(l.ln1_b), N, C, st));
    a.qkv = bf(N * 3 * C);
    RETURN_IF_ERROR(
        matmul_->Forward(a.qkv.as<bf16>(), a.ln1.as<const bf16>(), W(l.qkv_w), W(l.qkv_b), N, C, 3 * C, st));
    a.atty = bf(N * C), a.lse = f32(B * NH * T);
    RETURN_IF_ERROR(cuda::AttentionForward(a.atty.as<bf16>(), a.lse.as<float>(), a.qkv.as<const bf16>(), s->segments,
                                           B, T, C, NH, attention_mode_, st));
    a.x2 = bf(N * C);
    RETURN_IF_ERROR(matmul_->Forward(a.x2.as<bf16>(), a.atty.as<const bf16>(), W(l.proj_w), W(l.proj_b), N, C, C, st));
    RETURN_IF_ERROR(cuda::ResidualAdd(a.x2.as<bf16>(), a.x2.as<const bf16>(), a.x.as<const bf16>(), N * C, st));
    a.ln2 = bf(N * C), a.ln2_mean = f32(N), a.ln2_rstd = f32(N);
    RETURN_IF_ERROR(cuda::LayerNormForward(a.ln2.as<bf16>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                                           a.x2.as<const bf16>(), W(l.ln2_w), W(l.ln2_b), N, C, st));
    a.fc = bf(N * F), a.gelu = bf(N * F);
    RETURN_IF_ERROR(matmul_->Forward(a.fc.as<bf16>(), a.ln2.as<const bf16>(), W(l.fc_w), W(l.fc_b), N, C, F, st));
    RETURN_IF_ERROR(cuda::GeluForward(a.gelu.as<bf16>(), a.fc.as<const bf16>(), N * F, st));
    // The last layer of a stage that is not the last writes the stage output.
    const bool to_output = i + 1 == layers_.size() && !options_.last;
    Buffer next;
    bf16* out;
    if (to_output) {
      out = hidden_out;
    } else {
      next = bf(N * C);
      out = next.as<bf16>();
    }
    RETURN_IF_ERROR(matmul_->Forward(out, a.gelu.as<const bf16>(), W(l.mproj_w), W(l.mproj_b), N, F, C, st));
    RETURN_IF_ERROR(cuda::ResidualAdd(out, out, a.x2.as<const bf16>(), N * C, st));
    x = std::move(next);
  }
  if (layers_.empty() && !options_.last) {
    RETURN_IF_ERROR(CopyD2D(hidden_out, x.data(), static_cast<size_t>(N * C) * kBf16, st));
  }

  double loss = 0;
  if (options_.last && M > 0) {
    s->xs = bf(M * C);
    RETURN_IF_ERROR(cuda::GatherRows(s->xs.as<bf16>(), x.as<const bf16>(), s->scored, M, C, st));
    s->lnf = bf(M * C), s->lnf_mean = f32(M), s->lnf_rstd = f32(M);
    RETURN_IF_ERROR(cuda::LayerNormForward(s->lnf.as<bf16>(), s->lnf_mean.as<float>(), s->lnf_rstd.as<float>(),
                                           s->xs.as<const bf16>(), W(lnf_w_), W(lnf_b_), M, C, st));
    // Loss only: the logits (M, V) are not kept; Backward recomputes them.
    Buffer logits = bf(M * V), loss_sum = f32(1), row_loss = f32(M);
    RETURN_IF_ERROR(matmul_->Forward(logits.as<bf16>(), s->lnf.as<const bf16>(), W(head_), nullptr, M, C, V, st));
    RETURN_IF_ERROR(Zero(loss_sum, st));
    RETURN_IF_ERROR(cuda::SoftmaxCrossEntropy(loss_sum.as<float>(), row_loss.as<float>(), nullptr,
                                              logits.as<const bf16>(), s->targets, loss_scale, M, V, st));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host_->loss, loss_sum.data(), kF32, cudaMemcpyDeviceToHost, st));
    RETURN_IF_ERROR(WaitStream("CudaGptStage::Forward loss"));
    loss = host_->loss;
  }
  stash_[mb] = std::move(s);
  return loss;
}

absl::Status CudaGptStage::Backward(int mb, const bf16* dhidden_out, bf16* dhidden_in) {
  auto it = stash_.find(mb);
  if (it == stash_.end()) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " was not forwarded"));
  if (!options_.last && dhidden_out == nullptr) return absl::InvalidArgumentError("output gradient: missing");
  if (!options_.first && dhidden_in == nullptr) return absl::InvalidArgumentError("input gradient: missing");
  std::unique_ptr<Stash> s = std::move(it->second);
  stash_.erase(it);
  const int64_t B = s->rows, T = s->seq, N = B * T, C = config_.hidden, F = config_.ffn, V = config_.vocab,
                NH = config_.heads, M = s->scored_count;
  cudaStream_t st = stream_;
  auto bf = [&](int64_t elements) { return Get(static_cast<size_t>(elements) * kBf16); };
  auto f32 = [&](int64_t elements) { return Get(static_cast<size_t>(elements) * kF32); };

  // Gradient of the residual stream (bf16), accumulated layer by layer downwards.
  Buffer dres = bf(N * C);
  if (options_.last) {
    RETURN_IF_ERROR(Zero(dres, st));
    if (M > 0) {
      // Recompute the logits from the stashed final LayerNorm output (one
      // (M, C) x (C, V) product) rather than keep (M, V) per micro-batch in
      // flight; the fused kernel then adds the gradient into zeroed dlogits.
      Buffer logits = bf(M * V), dlogits = bf(M * V), loss_sum = f32(1), row_loss = f32(M);
      RETURN_IF_ERROR(matmul_->Forward(logits.as<bf16>(), s->lnf.as<const bf16>(), W(head_), nullptr, M, C, V, st));
      RETURN_IF_ERROR(Zero(dlogits, st));
      RETURN_IF_ERROR(Zero(loss_sum, st));
      RETURN_IF_ERROR(cuda::SoftmaxCrossEntropy(loss_sum.as<float>(), row_loss.as<float>(), dlogits.as<bf16>(),
                                                logits.as<const bf16>(), s->targets, s->loss_scale, M, V, st));
      logits.Release();
      Buffer dlnf = bf(M * C), dxs = bf(M * C);
      RETURN_IF_ERROR(Zero(dlnf, st));
      RETURN_IF_ERROR(matmul_->Backward(dlnf.as<bf16>(), G(head_), nullptr, dlogits.as<const bf16>(),
                                        s->lnf.as<const bf16>(), W(head_), M, C, V, st));
      dlogits.Release();
      RETURN_IF_ERROR(Zero(dxs, st));
      RETURN_IF_ERROR(cuda::LayerNormBackward(dxs.as<bf16>(), G(lnf_w_), G(lnf_b_), dlnf.as<const bf16>(),
                                              s->xs.as<const bf16>(), W(lnf_w_), s->lnf_mean.as<const float>(),
                                              s->lnf_rstd.as<const float>(), M, C, st));
      RETURN_IF_ERROR(cuda::ScatterAddRows(dres.as<bf16>(), dxs.as<const bf16>(), s->scored, M, C, st));
    }
  } else {
    RETURN_IF_ERROR(CopyD2D(dres.data(), dhidden_out, static_cast<size_t>(N * C) * kBf16, st));
  }
  if (!layers_.empty()) {
    Buffer dF1 = bf(N * F), dF2 = bf(N * F), dln = bf(N * C), datty = bf(N * C), dqkv = bf(N * 3 * C),
           scratch = f32(cuda::AttentionBackwardScratchElements(B, T, C, NH));
    bf16* dr = dres.as<bf16>();
    for (size_t i = layers_.size(); i-- > 0;) {
      const Layer& l = layers_[i];
      Stash::LayerActs& a = s->layers[i];
      // MLP branch.
      RETURN_IF_ERROR(Zero(dF1, st));
      RETURN_IF_ERROR(matmul_->Backward(dF1.as<bf16>(), G(l.mproj_w), G(l.mproj_b), dr, a.gelu.as<const bf16>(),
                                        W(l.mproj_w), N, F, C, st));
      RETURN_IF_ERROR(Zero(dF2, st));
      RETURN_IF_ERROR(cuda::GeluBackward(dF2.as<bf16>(), a.fc.as<const bf16>(), dF1.as<const bf16>(), N * F, st));
      RETURN_IF_ERROR(Zero(dln, st));
      RETURN_IF_ERROR(matmul_->Backward(dln.as<bf16>(), G(l.fc_w), G(l.fc_b), dF2.as<const bf16>(),
                                        a.ln2.as<const bf16>(), W(l.fc_w), N, C, F, st));
      RETURN_IF_ERROR(cuda::LayerNormBackward(dr, G(l.ln2_w), G(l.ln2_b), dln.as<const bf16>(), a.x2.as<const bf16>(),
                                              W(l.ln2_w), a.ln2_mean.as<const float>(), a.ln2_rstd.as<const float>(),
                                              N, C, st));
      // Attention branch.
      RETURN_IF_ERROR(Zero(datty, st));
      RETURN_IF_ERROR(matmul_->Backward(datty.as<bf16>(), G(l.proj_w), G(l.proj_b), dr, a.atty.as<const bf16>(),
                                        W(l.proj_w), N, C, C, st));
      RETURN_IF_ERROR(Zero(dqkv, st));
      RETURN_IF_ERROR(cuda::AttentionBackward(dqkv.as<bf16>(), datty.as<const bf16>(), a.qkv.as<const bf16>(),
                                              a.atty.as<const bf16>(), a.lse.as<const float>(), s->segments, B, T, C,
                                              NH, attention_mode_, scratch.as<float>(), st));
      RETURN_IF_ERROR(Zero(dln, st));
      RETURN_IF_ERROR(matmul_->Backward(dln.as<bf16>(), G(l.qkv_w), G(l.qkv_b), dqkv.as<const bf16>(),
                                        a.ln1.as<const bf16>(), W(l.qkv_w), N, C, 3 * C, st));
      RETURN_IF_ERROR(cuda::LayerNormBackward(dr, G(l.ln1_w), G(l.ln1_b), dln.as<const bf16>(), a.x.as<const bf16>(),
                                              W(l.ln1_w), a.ln1_mean.as<const float>(), a.ln1_rstd.as<const float>(),
                                              N, C, st));
      a = Stash::LayerActs{};  // back to the pool early (stream-ordered reuse)
    }
  }
  if (options_.first) {
    RETURN_IF_ERROR(
        cuda::EmbeddingBackward(G(wte_), G(wpe_), dres.as<const bf16>(), s->tokens, s->positions, N, C, st));
  } else {
    RETURN_IF_ERROR(CopyD2D(dhidden_in, dres.data(), static_cast<size_t>(N * C) * kBf16, st));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaGptStage::GradNormSquared() {
  if (num_params_ == 0) return 0.0;
  Buffer sum = Get(sizeof(double));
  RETURN_IF_ERROR(Zero(sum, stream_));
  RETURN_IF_ERROR(cuda::SumOfSquares(grads_, num_params_, sum.as<double>(), stream_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host_->sum_squares, sum.data(), sizeof(double), cudaMemcpyDeviceToHost,
                                       stream_));
  RETURN_IF_ERROR(WaitStream("CudaGptStage::GradNormSquared"));
  return host_->sum_squares;
}

absl::Status CudaGptStage::AdamWStep(const cuda::AdamWParams& p) {
  if (num_params_ == 0) return absl::OkStatus();
  return cuda::AdamWStep(master_, compute_, grads_, m_, v_, num_params_, p, stream_);
}

namespace {

absl::Status CheckSpan(size_t got, int64_t want, const char* what) {
  if (got == static_cast<size_t>(want)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", got, " floats for a stage of ", want, " parameters"));
}

}  // namespace

absl::Status CudaGptStage::CopyParamsToHost(std::span<float> out) {
  RETURN_IF_ERROR(CheckSpan(out.size(), num_params_, "CopyParamsToHost"));
  if (num_params_ == 0) return absl::OkStatus();
  // Wait first: a pageable device -> host copy blocks the host until it is
  // done, so the queued work must be over before the call (deadline here).
  RETURN_IF_ERROR(WaitStream("CopyParamsToHost"));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), master_, out.size() * kF32, cudaMemcpyDeviceToHost, stream_));
  return WaitStream("CopyParamsToHost");
}

absl::Status CudaGptStage::CopyGradsToHost(std::span<float> out) {
  RETURN_IF_ERROR(CheckSpan(out.size(), num_params_, "CopyGradsToHost"));
  if (num_params_ == 0) return absl::OkStatus();
  RETURN_IF_ERROR(WaitStream("CopyGradsToHost"));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), grads_, out.size() * kF32, cudaMemcpyDeviceToHost, stream_));
  return WaitStream("CopyGradsToHost");
}

absl::Status CudaGptStage::SetParams(std::span<const float> in) {
  RETURN_IF_ERROR(CheckSpan(in.size(), num_params_, "SetParams"));
  if (num_params_ == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(master_, in.data(), in.size() * kF32, cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(cuda::CastF32ToBf16(master_, reinterpret_cast<uint16_t*>(compute_), num_params_, stream_));
  // `in` may be pinned, where the copy is truly asynchronous: wait before
  // the caller may free it.
  return WaitStream("SetParams");
}

}  // namespace dynapipe::runtime::model
