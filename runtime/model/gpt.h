#pragma once

// The GPT pipeline stage on the CPU backend: fp32 parameters, gradients,
// AdamW moments and activations in host memory, kernels of
// runtime/kernels/cpu. The model, its layout and its initial values are
// runtime/model/layout.h's, shared with the CUDA stage; the interface is the
// backend seam of runtime/model/stage.h.
//
// Forward stashes the activations backward needs, per micro-batch, in pool
// buffers; Backward releases them. With Recompute::kSelective the attention
// probabilities (heads x L x L per sample, or per row when materialized) are
// dropped after forward and recomputed in backward; with kFull only each
// layer's input is kept and the whole layer is recomputed. Recomputation runs the same arithmetic in the same order,
// so results are bit-identical whatever is kept.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cpu_stage.h"
#include "runtime/model/layout.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::model {

class GptStage final : public CpuStageBase {
 public:
  using Options = StageOptions;
  // `pool` holds the activations (host memory) and must outlive the stage.
  static absl::StatusOr<std::unique_ptr<GptStage>> Create(const GptConfig& config, const StageOptions& options,
                                                          BufferPool* pool);
  ~GptStage() override;
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;

  // Stage (the rest in CpuStageBase).
  absl::Status Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out, float loss_scale,
                       Recompute recompute) override;
  using Stage::Backward;
  absl::Status Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) override;
  absl::Status Infer(const TokenBatch& batch, const void* hidden_in, void* out) override;
  size_t in_flight() const override { return stash_.size(); }

  // Forward keeping everything (kNone), returning this micro-batch's loss.
  using Stage::ForwardLoss;
  absl::StatusOr<double> ForwardLoss(int mb, const TokenBatch& batch, const float* hidden_in, float* hidden_out,
                                     float loss_scale) {
    return Stage::ForwardLoss(mb, batch, hidden_in, hidden_out, loss_scale, Recompute::kNone);
  }

  // Elements of the hidden-state tensor crossing a stage boundary.
  int64_t HiddenElements(const TokenBatch& batch) const { return batch.rows * batch.seq * config().hidden; }

 private:
  struct Stash;
  struct LayerActs;
  GptStage(GptLayout layout, BufferPool* pool);
  // Forward returning the micro-batch's loss (Forward adds it to the total;
  // Infer drops it).
  absl::StatusOr<double> ForwardImpl(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out,
                                     float loss_scale, Recompute recompute);
  // Forward and backward over every cell of the batch (padding included).
  // Forward/Backward call them directly, or, when training with varlen
  // attention on a batch with padding, on the batch's real tokens only
  // (see Forward in gpt.cc).
  absl::StatusOr<double> ForwardDense(int mb, const TokenBatch& batch, const float* hidden_in, float* hidden_out,
                                      float loss_scale, Recompute recompute);
  absl::Status BackwardDense(int mb, const float* dhidden_out, float* dhidden_in, const GradsReady& ready);
  // BackwardDense's phases. The last stage's head (loss, final LayerNorm)
  // into the scored rows of `dres` (N, C); then one layer's backward, which
  // adds into the residual gradient `dr` (N, C), recomputing what forward
  // dropped first.
  struct LayerGrads;
  absl::Status HeadBackward(Stash& s, float* dres);
  absl::Status LayerBackward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, float* dr, LayerGrads& g);
  // Fills every activation of layer `l` from a.x (the micro-batch's shape,
  // segments and positions from `s`); writes the layer's output (N, C) to
  // `out` unless it is null (recomputation needs no output).
  absl::Status LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, float* out);

  std::map<int, std::unique_ptr<Stash>> stash_;
  static constexpr int kInferKey = -1;  // Infer's private stash key
};

}  // namespace dynapipe::runtime::model
