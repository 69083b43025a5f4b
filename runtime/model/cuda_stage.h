#pragma once

// What every pipeline stage on a CUDA device shares (CudaGptStage,
// CudaT5Stage): the device state of a layout's parameters and its AdamW
// optimizer (sharded under ZeRO-1), the losses kept on the device between
// TakeLoss calls, host copies for checkpoints, and the block's norm and
// feed-forward as model.block configures them. The model's forward and
// backward are the derived class's.
//
// Device state (one cudaMalloc each, P = the layout's parameter count, in
// layout order): fp32 master weights (P), their bf16 compute copy (P), fp32
// gradients (P, accumulated across micro-batches), fp32 AdamW moments m and
// v (P each): 18 bytes per parameter. Activations (bf16) and their
// statistics (fp32) come from the buffer pool on the compute stream; out of
// pool memory is an error (RESOURCE_EXHAUSTED), not an abort. Every
// tensor's offset must be a multiple of 8 elements (16-byte aligned cuBLASLt
// operands and vector loads in the optimizer): hidden is a multiple of 32
// here, so this asks model.ffn to be a multiple of 8.
//
// Every call enqueues work on the compute stream and returns once it is
// queued, except where a value must come back to the host (the last stage's
// loss, AddGradSumOfSquares, ExportState, CopyGradsToHost) or a host buffer
// must be released (ImportState): those wait for the stream, polling with a
// deadline (the stage's wait timeout) rather than blocking forever.
//
// Threads: one thread drives a stage (it owns the cuBLASLt handle and the
// stream's work), with the stage's device current.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/kernels/cuda/cudnn_attention.h"
#include "runtime/kernels/cuda/matmul.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/layout.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::model {

// Kernel choices made once per process (the CUDA backend, at start-up) and
// shared by its stages.
struct CudaKernels {
  // cuDNN's fused attention for varlen attention where a micro-batch's
  // sequences fit it (attention.h's tiled kernel otherwise, and always where
  // null); it must be bound to the stages' stream and outlive them. GPT
  // stages only.
  cuda::CudnnAttention* cudnn_attention = nullptr;
  // cuBLASLt epilogues for the bias, residual, GELU and bias-gradient glue
  // (separate kernels where false).
  bool matmul_epilogues = true;
};

class CudaStageBase : public Stage {
 public:
  using bf16 = __nv_bfloat16;

  // Waits (bounded) for the stream's work, which may still use the device
  // arrays; leaks them with an error logged if it does not finish.
  ~CudaStageBase() override;
  CudaStageBase(const CudaStageBase&) = delete;
  CudaStageBase& operator=(const CudaStageBase&) = delete;

  // Stage (the model's passes are the derived class's).
  const GptLayout& layout() const override { return layout_; }
  DType activation_dtype() const override { return DType::kBF16; }
  // 18 bytes per parameter; after ShardOptimizer 10, plus 8 per owned one.
  size_t state_bytes() const override;
  // One copy of the pending slots and one wait; the slots' fp32 losses are
  // summed in double in micro-batch order.
  absl::StatusOr<double> TakeLoss() override;
  // (P) fp32 on the device.
  float* grads() override { return grads_; }
  absl::Status ZeroGrads() override;
  // Sums over the layout's norm runs on the device (double), one copy back.
  absl::Status AddGradSumOfSquares(double* sum) override;
  // One device sum per piece (double), one copy back; waits for the stream.
  absl::Status GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) override;
  // ZeRO-1: AdamW moments only for the owned runs (packed in their order;
  // the device memory of the whole ones is freed). The fp32 master weights
  // stay whole: each rank updates its owned part, and the all-gather of
  // params() (the masters) brings the rest, after which ParamsGathered
  // rewrites the bf16 copy.
  absl::Status ShardOptimizer(std::span<const ParamRun> owned) override;
  float* params() override { return master_; }
  absl::Status ParamsGathered() override;
  // One AdamW launch per run of the decay group (args.adamw.weight_decay)
  // and per run of the rest (no decay), within the owned runs after
  // ShardOptimizer; rewrites the bf16 copy of what it updated. Enqueued.
  absl::Status OptimizerStep(const OptimizerStepArgs& args) override;
  // Master weights and moments to the host (moments outside the owned runs
  // as zeros after ShardOptimizer); waits for the stream.
  absl::Status ExportState(StageState* out) override;
  // Host -> master weights and moments (the owned runs' only, after
  // ShardOptimizer), then the bf16 copy from the masters; leaves the
  // gradients alone. Waits, so `in` may be freed on return.
  absl::Status ImportState(const StageState& in) override;

  // CUDA-specific views (tests, the profiler).
  cudaStream_t stream() const { return stream_; }
  const ParamInfo* FindParam(const std::string& name) const { return layout_.FindParam(name); }
  size_t num_params() const { return layout_.num_params(); }
  bool HasSharedEmbedding() const { return layout_.HasSharedEmbedding(); }
  // Gradients -> host (P floats); waits for the stream.
  absl::Status CopyGradsToHost(std::span<float> out);

  // fp32 master + bf16 copy + fp32 gradient, m, v.
  static constexpr size_t kStateBytesPerParam = 4 + 2 + 4 + 4 + 4;
  // Micro-batch losses held on the device between TakeLoss calls; more
  // forwards than this in one iteration fold the slots into the host total
  // (a wait) and go on.
  static constexpr int kLossSlots = 1024;

 protected:
  // INVALID_ARGUMENT for a config the kernels cannot run (head dimension
  // hidden / heads not 32, 64 or 128; ffn not a multiple of 8; kv heads not
  // dividing the heads) or a parameter offset that is not a multiple of 8,
  // before touching the device.
  static absl::Status CheckCudaLayout(const GptLayout& layout);
  CudaStageBase(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
                CudaKernels kernels);
  // Allocates the device state on the current device and initialises it
  // from the layout (GptLayout::Initialize: the CPU stage's values, bit for
  // bit). `what` names the stage in errors.
  absl::Status Init(const char* what);

  // Waits for the work queued on the stream so far, with the deadline.
  absl::Status WaitStream(const char* what);
  absl::StatusOr<Buffer> Get(size_t bytes);
  absl::StatusOr<Buffer> GetBf16(int64_t elements) { return Get(static_cast<size_t>(elements) * sizeof(bf16)); }
  absl::StatusOr<Buffer> GetF32(int64_t elements) { return Get(static_cast<size_t>(elements) * sizeof(float)); }
  // A tensor's bf16 compute weights and fp32 gradients; null for one the
  // block does not have (GptLayout::kAbsent).
  const bf16* W(size_t offset) const { return offset == GptLayout::kAbsent ? nullptr : compute_ + offset; }
  float* G(size_t offset) const { return offset == GptLayout::kAbsent ? nullptr : grads_ + offset; }

  // Stream-ordered: `b` zeroed; a device-to-device copy.
  absl::Status Zero(const Buffer& b);
  absl::Status CopyD2D(void* dst, const void* src, size_t bytes);
  static bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

  // The block's norm (model.block.norm, its epsilon GptConfig::NormEps) over
  // N rows of the hidden size, gain `w`, shift `b` (absent: none); RMS norm
  // leaves `mean` unused. Backward adds into dx.
  absl::Status NormForward(bf16* out, float* mean, float* rstd, const bf16* x, size_t w, size_t b, int64_t N);
  absl::Status NormBackward(bf16* dx, size_t w, size_t b, const bf16* dout, const bf16* x, const float* mean,
                            const float* rstd, int64_t N);
  // The feed-forward's first product and activation of `in` (N, C) into fc
  // (N, MlpWidth()) and act (N, F): GELU in the product's epilogue, ReLU,
  // gated GELU and SwiGLU as kernels of their own. Its backward from `dr` (the gradient
  // of the layer output, which went through the second product) into dln
  // (N, C), zeroed first; dF (N, F) and dfc (N, MlpWidth(), unused with
  // GELU) are scratch. Parameter gradients accumulate.
  absl::Status MlpForward(const GptLayout::Layer& l, const bf16* in, bf16* fc, bf16* act, int64_t N);
  absl::Status MlpBackward(const GptLayout::Layer& l, const bf16* in, const bf16* fc, const bf16* act,
                           const bf16* dr, bf16* dF, bf16* dfc, bf16* dln, int64_t N);
  // The LM head's loss over M scored rows: `lnf` (M, C) the head's input,
  // `targets` (M) device. HeadLoss adds it into the next loss slot (the
  // logits are not kept); HeadLossBackward recomputes the logits and adds
  // the head's gradient, writing its input's into `dlnf` (M, C, zeroed
  // first). Both enqueued.
  absl::Status HeadLoss(const bf16* lnf, const int32_t* targets, int64_t M, float loss_scale);
  absl::Status HeadLossBackward(const bf16* lnf, const int32_t* targets, int64_t M, float loss_scale, bf16* dlnf);

  GptLayout layout_;
  cudaStream_t stream_;
  BufferPool* pool_;
  std::chrono::seconds wait_timeout_;
  CudaKernels kernels_;
  std::unique_ptr<cuda::Matmul> matmul_;

 private:
  struct HostScalars;
  // Parameters in the owned runs (ZeRO-1).
  size_t OwnedTotal() const;
  // The next free loss slot on the device (zero: kernels add into it);
  // folds the slots into the host total first when all are pending.
  absl::StatusOr<float*> NextLossSlot();
  // Copies the pending slots back, waits, adds them to loss_folded_, zeroes them.
  absl::Status FoldLosses();

  std::vector<ParamRun> decay_runs_, no_decay_runs_, norm_runs_;
  float* master_ = nullptr;  // device (P)
  bf16* compute_ = nullptr;  // device (P)
  float* grads_ = nullptr;   // device (P)
  float* m_ = nullptr;       // device (P), or the owned runs' total after ShardOptimizer
  float* v_ = nullptr;       // likewise
  std::vector<ParamRun> owned_;  // ZeRO-1's owned runs; empty: every parameter
  HostScalars* host_ = nullptr;  // pinned: the losses and the sum of squares coming back
  float* loss_slots_ = nullptr;  // device (kLossSlots), zero where not pending
  int pending_losses_ = 0;       // slots written since the last fold
  double loss_folded_ = 0;       // host total of folded slots not yet taken
  cudaEvent_t done_ = nullptr;   // for WaitStream
};

}  // namespace dynapipe::runtime::model
