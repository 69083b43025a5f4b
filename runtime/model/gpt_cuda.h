#pragma once

// The GPT pipeline stage (runtime/model/stage.h) on a CUDA device: the model,
// parameter names, shapes, flat offsets, parameter groups and initial values
// of runtime/model/layout.h, computed with the kernels of
// runtime/kernels/cuda in mixed precision, so checkpoints and comparisons
// with the CPU stage (runtime/model/gpt.h) line up.
//
// Device state (one cudaMalloc each, P = the layout's parameter count, in
// layout order): fp32 master weights (P), their bf16 compute copy (P), fp32
// gradients (P, accumulated across micro-batches), fp32 AdamW moments m and
// v (P each): 18 bytes per parameter. Activations (bf16) and their
// statistics (fp32) come from the buffer pool on the compute stream; out of
// pool memory is an error (RESOURCE_EXHAUSTED), not an abort. The CUDA
// layout needs every tensor's offset to be a multiple of 8 elements (16-byte
// aligned cuBLASLt operands and vector loads in the optimizer): hidden is a
// multiple of 32 here, so this asks model.ffn to be a multiple of 8.
//
// Recompute: kFull keeps only each layer's input and runs the layer's
// forward again in Backward. kSelective is the same as kNone here: the
// attention already keeps only its log-sum-exp (flash-style) and recomputes
// the probabilities in its backward, so there is nothing more to drop.
//
// Every call enqueues work on the compute stream and returns once it is
// queued, except where a value must come back to the host (the last stage's
// loss, AddGradSumOfSquares, ExportState, CopyGradsToHost) or a host buffer
// must be released (ImportState): those wait for the stream, polling with a
// deadline (the stage's wait timeout) rather than blocking forever.
//
// Device pointers passed in (hidden states, their gradients, logits) are
// bf16, must be 16-byte aligned and ready for work queued on the compute
// stream (their producers ordered before it).
//
// Threads: one thread drives a stage (it owns the stash, the cuBLASLt handle
// and the stream's work), with the stage's device current.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/kernels/cuda/attention.h"
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
  // null); it must be bound to the stages' stream and outlive them.
  cuda::CudnnAttention* cudnn_attention = nullptr;
  // cuBLASLt epilogues for the bias, residual, GELU and bias-gradient glue
  // (separate kernels where false).
  bool matmul_epilogues = true;
};

class CudaGptStage final : public Stage {
 public:
  using bf16 = __nv_bfloat16;

  // INVALID_ARGUMENT for a config the kernels cannot run (head dimension
  // hidden / heads not 32, 64 or 128; ffn not a multiple of 8) or a bad layer
  // range, before touching the device. Then allocates the device state on the
  // current device and initialises it from the layout (GptLayout::Initialize:
  // the CPU stage's values, bit for bit). `pool` must allocate device memory
  // (CudaAllocator) and outlive the stage; its buffers are taken for
  // `compute_stream`. `wait_timeout` bounds every host wait for the stream.
  static absl::StatusOr<std::unique_ptr<CudaGptStage>> Create(const GptConfig& config, const StageOptions& options,
                                                              cudaStream_t compute_stream, BufferPool* pool,
                                                              absl::Duration wait_timeout = absl::Minutes(5),
                                                              CudaKernels kernels = {});
  // Waits (bounded) for the stream's work, which may still use the stash and
  // the device arrays; leaks the arrays with an error logged if it does not
  // finish.
  ~CudaGptStage() override;
  CudaGptStage(const CudaGptStage&) = delete;
  CudaGptStage& operator=(const CudaGptStage&) = delete;

  // Stage. Tensors crossing the interface are bf16 device pointers:
  // hidden_in, hidden_out, dhidden_out, dhidden_in (rows, seq, hidden); the
  // last stage's Infer output (rows * seq, vocab).
  const GptLayout& layout() const override { return layout_; }
  DType activation_dtype() const override { return DType::kBF16; }
  // 18 bytes per parameter; after ShardOptimizer 10, plus 8 per owned one.
  size_t state_bytes() const override;
  // Enqueued, never waits: the last stage's loss stays on the device, in one
  // slot per micro-batch, until TakeLoss. `hidden_in` is copied into the
  // stash by the first work the call queues.
  absl::Status Forward(int mb, const TokenBatch& batch,
                       const void* hidden_in,  // (B, T, C) bf16, or null on the first stage
                       void* hidden_out,       // (B, T, C) bf16, or null on the last stage
                       float loss_scale, Recompute recompute) override;
  // One copy of the pending slots and one wait; the slots' fp32 losses are
  // summed in double in micro-batch order (as the host summed them before).
  absl::StatusOr<double> TakeLoss() override;
  // `ready` hears of every gradient at once, once the whole backward is
  // queued (the kernels run layer by layer, but the stream orders them).
  using Stage::Backward;
  absl::Status Backward(int mb,
                        const void* dhidden_out,  // (B, T, C) bf16, or null on the last stage
                        void* dhidden_in,         // (B, T, C) bf16, or null on the first stage
                        const GradsReady& ready) override;
  // Enqueued; the stash it builds is dropped before it returns (stream-ordered).
  absl::Status Infer(const TokenBatch& batch,
                     const void* hidden_in,  // (B, T, C) bf16, or null on the first stage
                     void* out) override;    // last stage (B * T, V) bf16 logits, else (B, T, C) bf16
  size_t in_flight() const override { return stash_.size(); }
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
  // Elements of the hidden-state tensor crossing a stage boundary.
  int64_t HiddenElements(const TokenBatch& batch) const { return batch.rows * batch.seq * config().hidden; }
  // Gradients -> host (P floats); waits for the stream.
  absl::Status CopyGradsToHost(std::span<float> out);

  // fp32 master + bf16 copy + fp32 gradient, m, v.
  static constexpr size_t kStateBytesPerParam = 4 + 2 + 4 + 4 + 4;
  // Micro-batch losses held on the device between TakeLoss calls; more
  // forwards than this in one iteration fold the slots into the host total
  // (a wait) and go on.
  static constexpr int kLossSlots = 1024;

 private:
  struct Stash;
  struct LayerActs;
  struct HostScalars;
  CudaGptStage(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
               CudaKernels kernels);
  absl::Status Init();
  // Waits for the work queued on the stream so far, with the deadline.
  absl::Status WaitStream(const char* what);
  absl::StatusOr<Buffer> Get(size_t bytes);
  absl::StatusOr<Buffer> GetBf16(int64_t elements) { return Get(static_cast<size_t>(elements) * sizeof(bf16)); }
  absl::StatusOr<Buffer> GetF32(int64_t elements) { return Get(static_cast<size_t>(elements) * sizeof(float)); }
  // A tensor's bf16 compute weights and fp32 gradients; null for one the
  // block does not have (GptLayout::kAbsent).
  const bf16* W(size_t offset) const { return offset == GptLayout::kAbsent ? nullptr : compute_ + offset; }
  float* G(size_t offset) const { return offset == GptLayout::kAbsent ? nullptr : grads_ + offset; }
  // The block's norm (model.block.norm) over N rows of the hidden size, gain
  // `w`, shift `b` (absent: none); RMS norm leaves `mean` unused.
  absl::Status NormForward(bf16* out, float* mean, float* rstd, const bf16* x, size_t w, size_t b, int64_t N);
  absl::Status NormBackward(bf16* dx, size_t w, size_t b, const bf16* dout, const bf16* x, const float* mean,
                            const float* rstd, int64_t N);

  // The forward of `batch` up to the stage output (non-last stages, written
  // to hidden_out) or the final LayerNorm of the scored rows (last stage),
  // keeping what `recompute` asks for.
  absl::StatusOr<std::unique_ptr<Stash>> RunForward(const TokenBatch& batch,
                                                    const bf16* hidden_in,  // (B, T, C) or null
                                                    bf16* hidden_out,       // (B, T, C) or null
                                                    Recompute recompute);
  // RunForward's phases: the token-level int32 inputs to the device (and the
  // last stage's scored rows and targets); every layer from `x` (the stage
  // input, left holding the last layer's output unless that went to
  // hidden_out); the last stage's final LayerNorm of the scored rows of `x`.
  absl::Status UploadTokens(const TokenBatch& batch, Stash& s);
  absl::Status LayersForward(Stash& s, Buffer& x,
                             bf16* hidden_out,  // (B, T, C) or null
                             Recompute recompute);
  absl::Status FinalNormForward(Stash& s, const Buffer& x);  // x: (B, T, C)
  // Backward's phases: the last stage's head (logits recomputed, loss,
  // final LayerNorm) into the scored rows of `dres`; every layer, top down,
  // adding into the residual gradient `dr` and releasing each layer's
  // activations; one layer (recomputed first under kFull).
  struct LayerGrads;
  absl::Status HeadBackward(const Stash& s, bf16* dres);  // dres: (B, T, C)
  absl::Status LayersBackward(Stash& s, bf16* dr);         // dr: (B, T, C)
  absl::Status LayerBackward(const GptLayout::Layer& l, LayerActs& a, const Stash& s,
                             bf16* dr,  // (B, T, C)
                             LayerGrads& g);
  // Parameters in the owned runs (ZeRO-1).
  size_t OwnedTotal() const;
  // Fills every activation of layer `l` from a.x; writes the layer's output
  // to `out` unless it is null (recomputation needs no output).
  absl::Status LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s,
                            bf16* out);  // (B, T, C) or null
  // The MLP's first product and activation into a.fc and a.gelu (GELU in
  // the product's epilogue; ReLU and gated GELU as kernels of their own),
  // and its backward from the activation's output gradient g.dF through to
  // g.dln (zeroed first), which LayerBackward then takes through the norm.
  absl::Status MlpForward(const GptLayout::Layer& l, LayerActs& a, int64_t N);
  absl::Status MlpBackward(const GptLayout::Layer& l, const LayerActs& a, bf16* dr, LayerGrads& g, int64_t N);
  // The layer's attention, forward and backward, through cuDNN where the
  // stash holds a batch for it, else the tiled kernel.
  absl::Status AttentionForward(LayerActs& a, const Stash& s);
  absl::Status AttentionBackward(bf16* dqkv, const bf16* datty, const LayerActs& a, const Stash& s);
  // The stash's cuDNN batch (uploaded on the stream), or none where the
  // micro-batch takes the tiled kernel; the first reason for that is logged.
  absl::Status PrepareCudnnBatch(const TokenBatch& batch, Stash& s);
  // The last stage's loss of a stash (head, cross-entropy) into the next
  // loss slot; enqueued.
  absl::Status Loss(const Stash& s);
  // Copies the pending slots back, waits, adds them to loss_folded_, zeroes them.
  absl::Status FoldLosses();

  GptLayout layout_;
  cudaStream_t stream_;
  BufferPool* pool_;
  std::chrono::seconds wait_timeout_;
  cuda::AttentionMode attention_mode_;
  CudaKernels kernels_;
  std::string tiled_reason_;  // why the last micro-batch took the tiled kernel (logged when it changes)
  std::vector<ParamRun> decay_runs_, no_decay_runs_, norm_runs_;

  std::unique_ptr<cuda::Matmul> matmul_;
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
  std::map<int, std::unique_ptr<Stash>> stash_;
};

}  // namespace dynapipe::runtime::model
