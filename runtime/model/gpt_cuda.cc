// CudaGptStage: creation, and the attention (cuDNN's fused kernel or the
// tiled one). The forward and backward passes are in gpt_cuda_layers.cc;
// device state and the optimizer in cuda_stage.cc.

#include "runtime/model/gpt_cuda.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/model/gpt_cuda_stash.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {

namespace cuda = ::dynapipe::runtime::cuda;
using bf16 = __nv_bfloat16;

absl::StatusOr<std::unique_ptr<CudaGptStage>> CudaGptStage::Create(const GptConfig& config,
                                                                   const StageOptions& options,
                                                                   cudaStream_t compute_stream, BufferPool* pool,
                                                                   absl::Duration wait_timeout, CudaKernels kernels) {
  if (config.encoder_decoder) return absl::InvalidArgumentError("CudaGptStage: the model is an encoder-decoder");
  ASSIGN_OR_RETURN(GptLayout layout, GptLayout::Make(config, options));
  RETURN_IF_ERROR(CheckCudaLayout(layout));
  if (pool == nullptr) return absl::InvalidArgumentError("CudaGptStage: pool is null");
  std::unique_ptr<CudaGptStage> stage(
      new CudaGptStage(std::move(layout), compute_stream, pool, cuda::WaitSeconds(wait_timeout), kernels));
  RETURN_IF_ERROR(stage->Init("CudaGptStage::Create"));
  return stage;
}

CudaGptStage::CudaGptStage(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
                           CudaKernels kernels)
    : CudaStageBase(std::move(layout), stream, pool, wait_timeout, kernels),
      attention_mode_(layout_.config().attention == AttentionKernel::kMaterialized ? cuda::AttentionMode::kMaterialized
                                                                                   : cuda::AttentionMode::kVarlen) {}

CudaGptStage::~CudaGptStage() = default;

absl::Status CudaGptStage::PrepareCudnnBatch(const TokenBatch& batch, Stash& s) {
  std::string why;
  if (kernels_.cudnn_attention == nullptr) {
    return absl::OkStatus();  // the process chose the tiled kernel (logged by the backend)
  } else if (attention_mode_ != cuda::AttentionMode::kVarlen) {
    why = "materialized attention (the packing baseline) computes every causal pair of a row";
  } else if (!cuda::CudnnAttentionSupportsHeadDim(config().hidden / config().heads)) {
    why = absl::StrCat("head dimension ", config().hidden / config().heads, " is not a multiple of 8 up to 128");
  } else {
    absl::StatusOr<cuda::CudnnAttentionBatch> b = cuda::MakeCudnnAttentionBatch(
        batch.segments.data(), batch.rows, batch.seq, config().hidden, config().heads);
    if (b.ok()) {
      s.cudnn = std::move(*b);
      s.cudnn_host.resize(s.cudnn->DeviceBytes());
      s.cudnn->Pack(s.cudnn_host.data());
      ASSIGN_OR_RETURN(s.cudnn_device, Get(s.cudnn_host.size()));
      // Pageable source, kept with the stash (as the ints in RunForward).
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.cudnn_device.data(), s.cudnn_host.data(), s.cudnn_host.size(),
                                           cudaMemcpyHostToDevice, stream_));
      s.cudnn_arrays = cuda::CudnnAttention::Locate(*s.cudnn, s.cudnn_device.data());
      return absl::OkStatus();
    }
    why = std::string(b.status().message());
  }
  if (why != tiled_reason_) {
    spdlog::info("attention: the tiled kernel runs this micro-batch, not cuDNN: {}", why);
    tiled_reason_ = why;
  }
  return absl::OkStatus();
}

absl::Status CudaGptStage::AttentionForward(LayerActs& a, const Stash& s) {
  const int64_t B = s.rows, T = s.seq, C = config().hidden, NH = config().heads;
  if (!s.cudnn.has_value()) {
    return cuda::AttentionForward(a.atty.as<bf16>(), a.lse.as<float>(), a.qkv.as<const bf16>(), s.segments, B, T, C,
                                  NH, attention_mode_, stream_);
  }
  cuda::CudnnAttention& att = *kernels_.cudnn_attention;
  ASSIGN_OR_RETURN(const size_t bytes, att.ForwardWorkspace(*s.cudnn, B, T, C, NH));
  ASSIGN_OR_RETURN(Buffer ws, Get(std::max<size_t>(bytes, 256)));
  // cuDNN writes the tokens of sequences only: padding rows must read as 0.
  RETURN_IF_ERROR(Zero(a.atty));
  return att.Forward(a.atty.as<bf16>(), a.lse.as<float>(), a.qkv.as<const bf16>(), *s.cudnn, s.cudnn_arrays, B, T, C,
                     NH, ws.data(), ws.bytes(), stream_);
}

absl::Status CudaGptStage::AttentionBackward(bf16* dqkv, const bf16* datty, const LayerActs& a, const Stash& s) {
  const int64_t B = s.rows, T = s.seq, C = config().hidden, NH = config().heads;
  if (!s.cudnn.has_value()) {
    ASSIGN_OR_RETURN(Buffer scratch, GetF32(cuda::AttentionBackwardScratchElements(B, T, C, NH)));
    return cuda::AttentionBackward(dqkv, datty, a.qkv.as<const bf16>(), a.atty.as<const bf16>(),
                                   a.lse.as<const float>(), s.segments, B, T, C, NH, attention_mode_,
                                   scratch.as<float>(), stream_);
  }
  cuda::CudnnAttention& att = *kernels_.cudnn_attention;
  ASSIGN_OR_RETURN(const size_t bytes, att.BackwardWorkspace(*s.cudnn, B, T, C, NH));
  ASSIGN_OR_RETURN(Buffer ws, Get(bytes));
  return att.Backward(dqkv, datty, a.qkv.as<const bf16>(), a.atty.as<const bf16>(), a.lse.as<const float>(), *s.cudnn,
                      s.cudnn_arrays, B, T, C, NH, ws.data(), ws.bytes(), stream_);
}

}  // namespace dynapipe::runtime::model
