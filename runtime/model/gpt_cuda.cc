// CudaGptStage: creation, device state, gradients, the optimizer step and
// host copies. The forward and backward passes are in gpt_cuda_layers.cc.

#include "runtime/model/gpt_cuda.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/cast.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/kernels/cuda/optimizer.h"
#include "runtime/model/gpt_cuda_stash.h"
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

absl::StatusOr<std::unique_ptr<CudaGptStage>> CudaGptStage::Create(const GptConfig& config,
                                                                   const StageOptions& options,
                                                                   cudaStream_t compute_stream, BufferPool* pool,
                                                                   absl::Duration wait_timeout, CudaKernels kernels) {
  RETURN_IF_ERROR(CheckCudaConfig(config));
  ASSIGN_OR_RETURN(GptLayout layout, GptLayout::Make(config, options));
  for (const ParamInfo& p : layout.params()) {
    if (p.offset % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.name, ": offset ", p.offset, " is not a multiple of 8 elements"));
    }
  }
  if (pool == nullptr) return absl::InvalidArgumentError("CudaGptStage: pool is null");
  std::unique_ptr<CudaGptStage> stage(
      new CudaGptStage(std::move(layout), compute_stream, pool, cuda::WaitSeconds(wait_timeout), kernels));
  RETURN_IF_ERROR(stage->Init());
  return stage;
}

CudaGptStage::CudaGptStage(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
                           CudaKernels kernels)
    : layout_(std::move(layout)),
      stream_(stream),
      pool_(pool),
      wait_timeout_(wait_timeout),
      attention_mode_(layout_.config().attention == AttentionKernel::kMaterialized ? cuda::AttentionMode::kMaterialized
                                                                                   : cuda::AttentionMode::kVarlen),
      kernels_(kernels),
      decay_runs_(layout_.DecayRuns(true)),
      no_decay_runs_(layout_.DecayRuns(false)),
      norm_runs_(layout_.NormRuns()) {}

absl::Status CudaGptStage::Init() {
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
  return WaitStream("CudaGptStage::Create");
}

CudaGptStage::~CudaGptStage() {
  // The stash's buffers return to the pool's stream cache (stream-ordered, so
  // they may go at once); the arrays and the cuBLASLt workspace only once the
  // queued work that reads them has finished. cudaFree would wait for the
  // device without a deadline: if the stream is stuck, leak instead.
  bool idle = true;
  if (done_ != nullptr) {
    if (absl::Status s = WaitStream("destroying the stage"); !s.ok()) {
      spdlog::error("CudaGptStage: {}; leaking its device memory", s.message());
      idle = false;
    }
  }
  stash_.clear();
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

absl::StatusOr<Buffer> CudaGptStage::Get(size_t bytes) { return pool_->Get(bytes, cuda::Handle(stream_)); }

absl::Status CudaGptStage::WaitStream(const char* what) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
  return cuda::WaitForEvent(done_, wait_timeout_, what);
}

absl::Status CudaGptStage::ZeroGrads() {
  if (layout_.num_params() == 0) return absl::OkStatus();
  return cuda::CudaStatus(cudaMemsetAsync(grads_, 0, layout_.num_params() * kF32, stream_), "ZeroGrads");
}

absl::Status CudaGptStage::AddGradSumOfSquares(double* sum) {
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
  RETURN_IF_ERROR(WaitStream("CudaGptStage::AddGradSumOfSquares"));
  *sum += host_->sum_squares;
  return absl::OkStatus();
}

absl::Status CudaGptStage::GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) {
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
  RETURN_IF_ERROR(WaitStream("CudaGptStage::GradSumsOfSquares"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), acc.data(), pieces.size() * sizeof(double), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

size_t CudaGptStage::state_bytes() const {
  const size_t P = layout_.num_params();
  if (owned_.empty()) return P * kStateBytesPerParam;
  return P * (kStateBytesPerParam - 8) + OwnedTotal() * 8;
}

size_t CudaGptStage::OwnedTotal() const {
  size_t total = 0;
  for (const ParamRun& r : owned_) total += r.size;
  return total;
}

absl::Status CudaGptStage::ShardOptimizer(std::span<const ParamRun> owned) {
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
  RETURN_IF_ERROR(WaitStream("CudaGptStage::ShardOptimizer"));
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

absl::Status CudaGptStage::ParamsGathered() {
  if (owned_.empty() || layout_.num_params() == 0) return absl::OkStatus();
  return cuda::CastF32ToBf16(master_, reinterpret_cast<uint16_t*>(compute_),
                             static_cast<int64_t>(layout_.num_params()), stream_);
}

absl::Status CudaGptStage::OptimizerStep(const OptimizerStepArgs& args) {
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

absl::Status CudaGptStage::ExportState(StageState* out) {
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

absl::Status CudaGptStage::ImportState(const StageState& in) {
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

absl::Status CudaGptStage::CopyGradsToHost(std::span<float> out) {
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

}  // namespace dynapipe::runtime::model
