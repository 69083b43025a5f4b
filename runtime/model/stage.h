#pragma once

// The seam between the plan interpreter and a compute backend: one GPT
// pipeline stage (runtime/model/layout.h) with its parameters, gradients and
// AdamW moments, on the CPU (GptStage, fp32) or a CUDA device (CudaGptStage,
// bf16 activations, fp32 master weights). Code above the seam (the worker,
// checkpoints, the executor) never names a backend's types: tensors crossing
// it are opaque pointers into the backend's memory (its BufferPool), sized
// by activation_dtype(); host copies exist only for checkpoints.
//
// Forward stashes what backward needs per micro-batch; several micro-batches
// may be in flight (pipeline schedules run forwards ahead of backwards).
// Threads: one thread drives a stage.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/layout.h"
#include "runtime/optim/adamw.h"

namespace dynapipe::runtime::model {

// A stage's trainable state on the host, in layout order (num_params() each).
struct StageState {
  std::vector<float> params, adam_m, adam_v;
};

// One optimizer step: AdamW with `adamw` (weight decay only on the layout's
// decay group), learning rate `lr`, bias correction for `step` (from 1),
// every gradient multiplied by `grad_scale` first (the clipping factor).
struct OptimizerStepArgs {
  optim::AdamWConfig adamw;
  double lr = 0;
  int64_t step = 1;
  double grad_scale = 1;
};

class Stage {
 public:
  virtual ~Stage() = default;

  virtual const GptLayout& layout() const = 0;
  const GptConfig& config() const { return layout().config(); }
  const StageOptions& options() const { return layout().options(); }
  // Element type of hidden states and their gradients (stage inputs, outputs).
  virtual DType activation_dtype() const = 0;
  // Bytes of the hidden-state tensor crossing a stage boundary (a
  // decoder-only model's; see InputBytes / OutputBytes for any model).
  size_t HiddenBytes(const TokenBatch& batch) const {
    return static_cast<size_t>(batch.rows * batch.seq * config().hidden) * DTypeBytes(activation_dtype());
  }
  // Bytes of this stage's input (from the previous stage) and output (to
  // the next): GptConfig::BoundaryElements at its first layer and past its
  // last.
  size_t InputBytes(const TokenBatch& batch) const { return BoundaryBytes(batch, options().first_layer); }
  size_t OutputBytes(const TokenBatch& batch) const {
    return BoundaryBytes(batch, options().first_layer + options().num_layers);
  }
  size_t BoundaryBytes(const TokenBatch& batch, int layer) const {
    return static_cast<size_t>(config().BoundaryElements(batch.rows, batch.seq, batch.enc_seq, layer)) *
           DTypeBytes(activation_dtype());
  }
  // Bytes of parameters, gradients and optimizer state this stage holds.
  virtual size_t state_bytes() const = 0;

  // Forward of micro-batch `mb`. The first stage reads batch.tokens and
  // positions, later stages `hidden_in` (rows, seq, hidden). Stages other
  // than the last write `hidden_out`. The last stage adds the loss summed
  // over scored tokens, each weighted by `loss_scale` (1 / loss tokens of the
  // global batch), to its loss total (TakeLoss) without waiting for a
  // device; other stages add nothing. `recompute` decides what is kept for
  // backward. `hidden_in` may be reused by work ordered after the call.
  virtual absl::Status Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                               float loss_scale, Recompute recompute) = 0;
  // The loss total of the micro-batches forwarded since the last call (0 on
  // other stages than the last), which starts again from 0. On a device this
  // is the one wait for the losses of an iteration.
  virtual absl::StatusOr<double> TakeLoss() = 0;
  // Forward, then TakeLoss: this micro-batch's loss (plus any not yet taken)
  // at once, for tests and tools.
  absl::StatusOr<double> ForwardLoss(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                                     float loss_scale, Recompute recompute = Recompute::kNone) {
    if (absl::Status s = Forward(mb, batch, hidden_in, hidden_out, loss_scale, recompute); !s.ok()) return s;
    return TakeLoss();
  }
  // Backward of micro-batch `mb`, accumulating parameter gradients.
  // `dhidden_out`: gradient of this stage's output (null on the last stage).
  // `dhidden_in`: receives the gradient of the stage input (not written on
  // the first stage; may be null there).
  absl::Status Backward(int mb, const void* dhidden_out, void* dhidden_in) {
    return Backward(mb, dhidden_out, dhidden_in, GradsReady());
  }
  // Called by the stage's last backward of an iteration each time a run of
  // parameters [offset, offset + size) (layout order) has its final
  // gradient, so that its reduction can start while backward goes on. On a
  // device, "final" means queued on the backend's stream. An error fails the
  // backward.
  using GradsReady = std::function<absl::Status(size_t offset, size_t size)>;
  // The same, reporting gradients as they become final through `ready`
  // (empty: not reported). Every parameter is reported exactly once.
  virtual absl::Status Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) = 0;
  // Forward without keeping anything for backward (evaluation): like
  // Forward, except that the last stage writes the logits of every position,
  // (rows * seq, vocab) in activation_dtype(), to `out`; other stages write
  // the hidden state.
  virtual absl::Status Infer(const TokenBatch& batch, const void* hidden_in, void* out) = 0;
  // Micro-batches forwarded but not yet backwarded.
  virtual size_t in_flight() const = 0;

  // The fp32 gradients (layout().num_params()) in the backend's memory, for
  // the all-reduces and the tied-embedding sum.
  virtual float* grads() = 0;
  virtual absl::Status ZeroGrads() = 0;
  // *sum += the sum of squares of the gradients in the layout's norm group,
  // accumulated in double (the host value, once the device is done).
  virtual absl::Status AddGradSumOfSquares(double* sum) = 0;
  // For each run of `pieces`, the sum of squares of its gradients that lie
  // in the layout's norm group, accumulated in double in index order, into
  // out[i] (the host values, once the device is done).
  virtual absl::Status GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) = 0;
  // One AdamW step over every parameter (see OptimizerStepArgs), or, after
  // ShardOptimizer, over the owned runs only. Leaves the gradients to the
  // caller (ZeroGrads).
  virtual absl::Status OptimizerStep(const OptimizerStepArgs& args) = 0;
  // ZeRO-1: from now on the optimizer updates, and keeps AdamW moments for,
  // only `owned` (disjoint runs in layout order); the other parameters come
  // from the ranks that own them (an all-gather of params()). Call before
  // the first step. UNIMPLEMENTED where the backend cannot shard.
  virtual absl::Status ShardOptimizer(std::span<const ParamRun> owned) = 0;
  // The parameters in the layout's order, in the backend's memory, for the
  // all-gather after a sharded step (fp32; null where ShardOptimizer is
  // unimplemented).
  virtual float* params() = 0;
  // After that all-gather completed: the backend refreshes what it derives
  // from params() (the CUDA stage's bf16 compute copy). Enqueued.
  virtual absl::Status ParamsGathered() { return absl::OkStatus(); }

  // Parameters and AdamW moments to / from the host (checkpoints, tests).
  // Import checks every size against the layout (INVALID_ARGUMENT). After
  // ShardOptimizer, moments outside the owned runs export as zeros and are
  // ignored on import.
  virtual absl::Status ExportState(StageState* out) = 0;
  virtual absl::Status ImportState(const StageState& in) = 0;
};

}  // namespace dynapipe::runtime::model
