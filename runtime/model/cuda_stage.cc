// CudaStageBase: device state, gradients, the optimizer step, losses, host
// copies, and the block's norm and feed-forward.

#include "runtime/model/cuda_stage.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/cast.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/kernels/cuda/optimizer.h"
#include "runtime/kernels/cuda/cross_entropy.h"
#include "runtime/kernels/cuda/gelu.h"
#include "runtime/kernels/cuda/layernorm.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cuda = ::dynapipe::runtime::cuda;

namespace {

constexpr size_t kBf16 = sizeof(__nv_bfloat16), kF32 = sizeof(float);

// Everything the kernels cannot run, before touching the device.
absl::Status CheckCudaConfig(const GptConfig& config) {
  if (config.hidden <= 0 || config.heads <= 0 || config.hidden % config.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", config.heads, " does not divide model.hidden ", config.hidden));
  }
  if (config.KvHeads() <= 0 || config.heads % config.KvHeads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.kv_heads: ", config.KvHeads(), " does not divide model.heads ", config.heads));
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
  return absl::OkStatus();
}

}  // namespace

// Values coming back to the host, in pinned memory so the copies are truly
// asynchronous and WaitStream bounds the wait.
struct CudaStageBase::HostScalars {
  double sum_squares = 0;
  float losses[kLossSlots] = {};  // TakeLoss's copy of the device's slots
};

absl::Status CudaStageBase::CheckCudaLayout(const GptLayout& layout) {
  RETURN_IF_ERROR(CheckCudaConfig(layout.config()));
  for (const ParamInfo& p : layout.params()) {
    if (p.offset % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.name, ": offset ", p.offset, " is not a multiple of 8 elements"));
    }
  }
  return absl::OkStatus();
}

CudaStageBase::CudaStageBase(GptLayout layout, cudaStream_t stream, BufferPool* pool,
                             std::chrono::seconds wait_timeout, CudaKernels kernels)
    : layout_(std::move(layout)),
      stream_(stream),
      pool_(pool),
      wait_timeout_(wait_timeout),
      kernels_(kernels),
      decay_runs_(layout_.DecayRuns(true)),
      no_decay_runs_(layout_.DecayRuns(false)),
      norm_runs_(layout_.NormRuns()) {}

absl::Status CudaStageBase::Init(const char* what) {
  cuda::Matmul::Options mo;
  mo.epilogues = kernels_.matmul_epilogues;
  mo.warn = [](std::string_view m) { spdlog::warn("{}", m); };
  ASSIGN_OR_RETURN(matmul_, cuda::Matmul::Create(std::move(mo)));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  void* host = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&host, sizeof(HostScalars)));
  host_ = new (host) HostScalars();
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&loss_slots_), kLossSlots * kF32));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(loss_slots_, 0, kLossSlots * kF32, stream_));
  const size_t P = layout_.num_params();
  if (P == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&master_), P * kF32));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&compute_), P * kBf16));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&grads_), P * kF32));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&m_), P * kF32));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&v_), P * kF32));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grads_, 0, P * kF32, stream_));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m_, 0, P * kF32, stream_));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v_, 0, P * kF32, stream_));
  // The initial values are drawn on the device, from the layout's rules and
  // the generator the CPU stage uses (the same bits: layout.h).
  for (const InitRule& r : layout_.InitRules()) {
    const int64_t n = static_cast<int64_t>(r.size);
    RETURN_IF_ERROR(r.normal ? cuda::FillKeyedNormal(master_ + r.offset, r.key, r.std, n, stream_)
                             : cuda::FillF32(master_ + r.offset, r.value, n, stream_));
  }
  RETURN_IF_ERROR(
      cuda::CastF32ToBf16(master_, reinterpret_cast<uint16_t*>(compute_), static_cast<int64_t>(P), stream_));
  return WaitStream(what);
}

CudaStageBase::~CudaStageBase() {
  // The derived stage's stash went first: its buffers return to the pool's
  // stream cache (stream-ordered, so they may go at once); the arrays and the
  // cuBLASLt workspace only once the queued work that reads them has finished. cudaFree would wait for the
  // device without a deadline: if the stream is stuck, leak instead.
  bool idle = true;
  if (done_ != nullptr) {
    if (absl::Status s = WaitStream("destroying the stage"); !s.ok()) {
      spdlog::error("CUDA stage: {}; leaking its device memory", s.message());
      idle = false;
    }
  }
  if (!idle) {
    (void)matmul_.release();
    return;
  }
  matmul_.reset();
  for (void* p : {static_cast<void*>(master_), static_cast<void*>(compute_), static_cast<void*>(grads_),
                  static_cast<void*>(m_), static_cast<void*>(v_), static_cast<void*>(loss_slots_)}) {
    if (p != nullptr) cudaFree(p);
  }
  if (host_ != nullptr) cudaFreeHost(host_);
  if (done_ != nullptr) cudaEventDestroy(done_);
}

absl::StatusOr<Buffer> CudaStageBase::Get(size_t bytes) { return pool_->Get(bytes, cuda::Handle(stream_)); }

absl::Status CudaStageBase::WaitStream(const char* what) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
  return cuda::WaitForEvent(done_, wait_timeout_, what);
}

absl::Status CudaStageBase::ZeroGrads() {
  if (layout_.num_params() == 0) return absl::OkStatus();
  return cuda::CudaStatus(cudaMemsetAsync(grads_, 0, layout_.num_params() * kF32, stream_), "ZeroGrads");
}

absl::Status CudaStageBase::AddGradSumOfSquares(double* sum) {
  if (sum == nullptr) return absl::InvalidArgumentError("AddGradSumOfSquares: sum is null");
  if (norm_runs_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Buffer acc, Get(sizeof(double)));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc.data(), 0, sizeof(double), stream_));
  // The norm group only: the last stage's copy of a tied embedding is
  // counted by the first stage (GptLayout), as on the CPU.
  for (const ParamRun& r : norm_runs_) {
    RETURN_IF_ERROR(cuda::SumOfSquares(G(r.offset), static_cast<int64_t>(r.size), acc.as<double>(), stream_));
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&host_->sum_squares, acc.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_ERROR(WaitStream("CUDA stage: AddGradSumOfSquares"));
  *sum += host_->sum_squares;
  return absl::OkStatus();
}

absl::Status CudaStageBase::GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) {
  if (out.size() != pieces.size()) return absl::InvalidArgumentError("GradSumsOfSquares: one sum per piece");
  if (pieces.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Buffer acc, Get(pieces.size() * sizeof(double)));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc.data(), 0, pieces.size() * sizeof(double), stream_));
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (const ParamRun& r : norm_runs_) {
      const size_t lo = std::max(r.offset, pieces[i].offset);
      const size_t hi = std::min(r.offset + r.size, pieces[i].offset + pieces[i].size);
      if (lo >= hi) continue;
      RETURN_IF_ERROR(cuda::SumOfSquares(G(lo), static_cast<int64_t>(hi - lo), acc.as<double>() + i, stream_));
    }
  }
  // Drain the stream first (bounded): a copy into pageable memory would
  // block the host until the stream reached it, with no deadline.
  RETURN_IF_ERROR(WaitStream("CUDA stage: GradSumsOfSquares"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), acc.data(), pieces.size() * sizeof(double), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

size_t CudaStageBase::state_bytes() const {
  const size_t P = layout_.num_params();
  if (owned_.empty()) return P * kStateBytesPerParam;
  return P * (kStateBytesPerParam - 8) + OwnedTotal() * 8;
}

size_t CudaStageBase::OwnedTotal() const {
  size_t total = 0;
  for (const ParamRun& r : owned_) total += r.size;
  return total;
}

absl::Status CudaStageBase::ShardOptimizer(std::span<const ParamRun> owned) {
  const size_t P = layout_.num_params();
  size_t total = 0, end = 0;
  for (const ParamRun& r : owned) {
    if (r.offset < end || r.offset + r.size > P) {
      return absl::InvalidArgumentError(absl::StrCat("ShardOptimizer: run [", r.offset, ", ", r.offset + r.size,
                                                     ") overlaps or lies outside the stage's ", P, " parameters"));
    }
    end = r.offset + r.size;
    total += r.size;
  }
  // The whole moments go once the stream no longer uses them (bounded wait).
  RETURN_IF_ERROR(WaitStream("CUDA stage: ShardOptimizer"));
  for (float** p : {&m_, &v_}) {
    if (*p != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(*p));
    *p = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(p), std::max<size_t>(total, 1) * kF32));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*p, 0, std::max<size_t>(total, 1) * kF32, stream_));
  }
  // A rank owning nothing keeps one empty run: sharded all the same.
  owned_.assign(owned.begin(), owned.end());
  if (owned_.empty()) owned_.push_back({0, 0});
  return absl::OkStatus();
}

absl::Status CudaStageBase::ParamsGathered() {
  if (owned_.empty() || layout_.num_params() == 0) return absl::OkStatus();
  return cuda::CastF32ToBf16(master_, reinterpret_cast<uint16_t*>(compute_),
                             static_cast<int64_t>(layout_.num_params()), stream_);
}

absl::Status CudaStageBase::OptimizerStep(const OptimizerStepArgs& args) {
  cuda::AdamWParams p{static_cast<float>(args.lr),
                      static_cast<float>(args.adamw.beta1),
                      static_cast<float>(args.adamw.beta2),
                      static_cast<float>(args.adamw.eps),
                      static_cast<float>(args.adamw.weight_decay),
                      args.step,
                      static_cast<float>(args.grad_scale)};
  // Whole: offsets are multiples of 8 elements, so every launch keeps the
  // 16-byte aligned vector path; moments are indexed like parameters.
  // Sharded: each group run cut to the owned runs, moments packed in owned
  // order (shard edges need not be aligned: the kernel has a scalar path).
  auto step = [&](const ParamRun& r, float weight_decay) -> absl::Status {
    p.weight_decay = weight_decay;
    if (owned_.empty()) {
      return cuda::AdamWStep(master_ + r.offset, compute_ + r.offset, G(r.offset), m_ + r.offset, v_ + r.offset,
                             static_cast<int64_t>(r.size), p, stream_);
    }
    size_t moment = 0;
    for (const ParamRun& o : owned_) {
      const size_t lo = std::max(r.offset, o.offset), hi = std::min(r.offset + r.size, o.offset + o.size);
      if (lo < hi) {
        const size_t at = moment + (lo - o.offset);
        RETURN_IF_ERROR(cuda::AdamWStep(master_ + lo, compute_ + lo, G(lo), m_ + at, v_ + at,
                                        static_cast<int64_t>(hi - lo), p, stream_));
      }
      moment += o.size;
    }
    return absl::OkStatus();
  };
  const float decay = p.weight_decay;
  for (const ParamRun& r : decay_runs_) RETURN_IF_ERROR(step(r, decay));
  for (const ParamRun& r : no_decay_runs_) RETURN_IF_ERROR(step(r, 0.0f));  // biases and LayerNorm gains
  return absl::OkStatus();
}

absl::Status CudaStageBase::ExportState(StageState* out) {
  if (out == nullptr) return absl::InvalidArgumentError("ExportState: out is null");
  const size_t P = layout_.num_params();
  out->params.assign(P, 0.0f);
  out->adam_m.assign(P, 0.0f);
  out->adam_v.assign(P, 0.0f);
  if (P == 0) return absl::OkStatus();
  // Wait first: a device -> pageable host copy blocks the host until it is
  // done, so the queued work must be over before the call (deadline here).
  RETURN_IF_ERROR(WaitStream("ExportState"));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->params.data(), master_, P * kF32, cudaMemcpyDeviceToHost, stream_));
  if (owned_.empty()) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->adam_m.data(), m_, P * kF32, cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->adam_v.data(), v_, P * kF32, cudaMemcpyDeviceToHost, stream_));
    return WaitStream("ExportState");
  }
  // Sharded: the packed moments land at their runs; the rest stays zero.
  size_t moment = 0;
  for (const ParamRun& o : owned_) {
    if (o.size > 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->adam_m.data() + o.offset, m_ + moment, o.size * kF32,
                                           cudaMemcpyDeviceToHost, stream_));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->adam_v.data() + o.offset, v_ + moment, o.size * kF32,
                                           cudaMemcpyDeviceToHost, stream_));
    }
    moment += o.size;
  }
  return WaitStream("ExportState");
}

absl::Status CudaStageBase::ImportState(const StageState& in) {
  const size_t P = layout_.num_params();
  if (in.params.size() != P || in.adam_m.size() != P || in.adam_v.size() != P) {
    return absl::InvalidArgumentError(absl::StrCat("stage state of ", in.params.size(), "/", in.adam_m.size(), "/",
                                                   in.adam_v.size(), " values for a stage of ", P, " parameters"));
  }
  if (P == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(master_, in.params.data(), P * kF32, cudaMemcpyHostToDevice, stream_));
  if (owned_.empty()) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m_, in.adam_m.data(), P * kF32, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v_, in.adam_v.data(), P * kF32, cudaMemcpyHostToDevice, stream_));
  } else {
    size_t moment = 0;
    for (const ParamRun& o : owned_) {
      if (o.size > 0) {
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m_ + moment, in.adam_m.data() + o.offset, o.size * kF32,
                                             cudaMemcpyHostToDevice, stream_));
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v_ + moment, in.adam_v.data() + o.offset, o.size * kF32,
                                             cudaMemcpyHostToDevice, stream_));
      }
      moment += o.size;
    }
  }
  RETURN_IF_ERROR(
      cuda::CastF32ToBf16(master_, reinterpret_cast<uint16_t*>(compute_), static_cast<int64_t>(P), stream_));
  // `in` may be pinned, where the copies are truly asynchronous: wait before
  // the caller may free it.
  return WaitStream("ImportState");
}

absl::Status CudaStageBase::CopyGradsToHost(std::span<float> out) {
  const size_t P = layout_.num_params();
  if (out.size() != P) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyGradsToHost: ", out.size(), " floats for a stage of ", P, " parameters"));
  }
  if (P == 0) return absl::OkStatus();
  RETURN_IF_ERROR(WaitStream("CopyGradsToHost"));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), grads_, P * kF32, cudaMemcpyDeviceToHost, stream_));
  return WaitStream("CopyGradsToHost");
}

absl::Status CudaStageBase::Zero(const Buffer& b) {
  if (b.empty()) return absl::OkStatus();
  return cuda::CudaStatus(cudaMemsetAsync(b.data(), 0, b.bytes(), stream_), "cudaMemsetAsync");
}

absl::Status CudaStageBase::CopyD2D(void* dst, const void* src, size_t bytes) {
  return cuda::CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync D2D");
}

absl::StatusOr<float*> CudaStageBase::NextLossSlot() {
  if (pending_losses_ == kLossSlots) RETURN_IF_ERROR(FoldLosses());
  return loss_slots_ + pending_losses_++;
}

absl::Status CudaStageBase::HeadLoss(const bf16* lnf, const int32_t* targets, int64_t M, float loss_scale) {
  if (M == 0) return absl::OkStatus();
  const int64_t C = config().hidden, V = config().vocab;
  ASSIGN_OR_RETURN(float* slot, NextLossSlot());
  ASSIGN_OR_RETURN(Buffer logits, GetBf16(M * V));
  ASSIGN_OR_RETURN(Buffer row_loss, GetF32(M));
  RETURN_IF_ERROR(matmul_->Forward(logits.as<bf16>(), lnf, W(layout_.head()), nullptr, M, C, V, stream_));
  // The slot is zero (Init, FoldLosses): the kernel adds into it.
  return cuda::SoftmaxCrossEntropy(slot, row_loss.as<float>(), nullptr, logits.as<const bf16>(), targets, loss_scale,
                                   M, V, stream_);
}

absl::Status CudaStageBase::HeadLossBackward(const bf16* lnf, const int32_t* targets, int64_t M, float loss_scale,
                                             bf16* dlnf) {
  if (M == 0) return absl::OkStatus();
  const int64_t C = config().hidden, V = config().vocab;
  const size_t head = layout_.head();
  // Recompute the logits (one (M, C) x (C, V) product) rather than keep
  // (M, V) per micro-batch in flight; the fused kernel then adds the
  // gradient into zeroed dlogits.
  ASSIGN_OR_RETURN(Buffer logits, GetBf16(M * V));
  ASSIGN_OR_RETURN(Buffer dlogits, GetBf16(M * V));
  ASSIGN_OR_RETURN(Buffer loss_sum, GetF32(1));
  ASSIGN_OR_RETURN(Buffer row_loss, GetF32(M));
  RETURN_IF_ERROR(matmul_->Forward(logits.as<bf16>(), lnf, W(head), nullptr, M, C, V, stream_));
  RETURN_IF_ERROR(Zero(dlogits));
  RETURN_IF_ERROR(Zero(loss_sum));
  RETURN_IF_ERROR(cuda::SoftmaxCrossEntropy(loss_sum.as<float>(), row_loss.as<float>(), dlogits.as<bf16>(),
                                            logits.as<const bf16>(), targets, loss_scale, M, V, stream_));
  logits.Release();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dlnf, 0, static_cast<size_t>(M * C) * kBf16, stream_));
  return matmul_->Backward(dlnf, G(head), nullptr, dlogits.as<const bf16>(), lnf, W(head), M, C, V, stream_);
}

absl::Status CudaStageBase::FoldLosses() {
  if (pending_losses_ == 0) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(pending_losses_) * kF32;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_->losses, loss_slots_, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(loss_slots_, 0, bytes, stream_));
  RETURN_IF_ERROR(WaitStream("CUDA stage: the micro-batches' losses"));
  for (int i = 0; i < pending_losses_; ++i) loss_folded_ += static_cast<double>(host_->losses[i]);
  pending_losses_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<double> CudaStageBase::TakeLoss() {
  RETURN_IF_ERROR(FoldLosses());
  const double loss = loss_folded_;
  loss_folded_ = 0;
  return loss;
}

absl::Status CudaStageBase::NormForward(bf16* out, float* mean, float* rstd, const bf16* x, size_t w, size_t b,
                                        int64_t N) {
  const int64_t C = config().hidden;
  const float eps = static_cast<float>(config().NormEps());  // as the CPU's fp32 norms round it
  if (config().norm == NormKind::kRms) return cuda::RmsNormForward(out, rstd, x, W(w), N, C, eps, stream_);
  return cuda::LayerNormForward(out, mean, rstd, x, W(w), W(b), N, C, eps, stream_);
}

absl::Status CudaStageBase::NormBackward(bf16* dx, size_t w, size_t b, const bf16* dout, const bf16* x,
                                         const float* mean, const float* rstd, int64_t N) {
  const int64_t C = config().hidden;
  if (config().norm == NormKind::kRms) return cuda::RmsNormBackward(dx, G(w), dout, x, W(w), rstd, N, C, stream_);
  return cuda::LayerNormBackward(dx, G(w), G(b), dout, x, W(w), mean, rstd, N, C, stream_);
}

absl::Status CudaStageBase::MlpForward(const GptLayout::Layer& l, const bf16* in, bf16* fc, bf16* act, int64_t N) {
  const int64_t C = config().hidden, F = config().ffn, Wd = config().MlpWidth();
  cudaStream_t st = stream_;
  switch (config().mlp) {
    case MlpKind::kGelu:  // in the fc product's epilogue, which also keeps its input (fc)
      return matmul_->ForwardGelu(act, fc, in, W(l.fc_w), W(l.fc_b), N, C, F, st);
    case MlpKind::kRelu:
      RETURN_IF_ERROR(matmul_->Forward(fc, in, W(l.fc_w), W(l.fc_b), N, C, F, st));
      return cuda::ReluForward(act, fc, N * F, st);
    case MlpKind::kGatedGelu:
      RETURN_IF_ERROR(matmul_->Forward(fc, in, W(l.fc_w), W(l.fc_b), N, C, Wd, st));
      return cuda::GatedGeluForward(act, fc, N, F, st);
    case MlpKind::kSwiglu:
      RETURN_IF_ERROR(matmul_->Forward(fc, in, W(l.fc_w), W(l.fc_b), N, C, Wd, st));
      return cuda::SwigluForward(act, fc, N, F, st);
  }
  return absl::InternalError("unknown model.block.mlp");
}

absl::Status CudaStageBase::MlpBackward(const GptLayout::Layer& l, const bf16* in, const bf16* fc, const bf16* act,
                                        const bf16* dr, bf16* dF, bf16* dfc, bf16* dln, int64_t N) {
  const int64_t C = config().hidden, F = config().ffn, Wd = config().MlpWidth();
  cudaStream_t st = stream_;
  const bf16* dpre = dF;
  if (config().mlp == MlpKind::kGelu) {
    // The GELU's gradient in the mproj product's epilogue.
    RETURN_IF_ERROR(matmul_->BackwardThroughGelu(dF, G(l.mproj_w), G(l.mproj_b), dr, act, W(l.mproj_w), fc, N, F, C,
                                                 st));
  } else {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dF, 0, static_cast<size_t>(N * F) * kBf16, st));
    RETURN_IF_ERROR(matmul_->Backward(dF, G(l.mproj_w), G(l.mproj_b), dr, act, W(l.mproj_w), N, F, C, st));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dfc, 0, static_cast<size_t>(N * Wd) * kBf16, st));
    if (config().mlp == MlpKind::kRelu) {
      RETURN_IF_ERROR(cuda::ReluBackward(dfc, fc, dF, N * F, st));
    } else if (config().mlp == MlpKind::kSwiglu) {
      RETURN_IF_ERROR(cuda::SwigluBackward(dfc, fc, dF, N, F, st));
    } else {
      RETURN_IF_ERROR(cuda::GatedGeluBackward(dfc, fc, dF, N, F, st));
    }
    dpre = dfc;
  }
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dln, 0, static_cast<size_t>(N * C) * kBf16, st));
  return matmul_->Backward(dln, G(l.fc_w), G(l.fc_b), dpre, in, W(l.fc_w), N, C, Wd, st);
}

}  // namespace dynapipe::runtime::model
