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
#include "runtime/model/layout.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::model {

class GptStage final : public Stage {
 public:
  using Options = StageOptions;
  // `pool` holds the activations (host memory) and must outlive the stage.
  static absl::StatusOr<std::unique_ptr<GptStage>> Create(const GptConfig& config, const StageOptions& options,
                                                          BufferPool* pool);
  ~GptStage() override;
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;

  // Stage.
  const GptLayout& layout() const override { return layout_; }
  DType activation_dtype() const override { return DType::kF32; }
  size_t state_bytes() const override { return (2 * layout_.num_params() + m_.size() + v_.size()) * sizeof(float); }
  absl::Status Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out, float loss_scale,
                       Recompute recompute) override;
  absl::StatusOr<double> TakeLoss() override;
  using Stage::Backward;
  absl::Status Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) override;
  absl::Status Infer(const TokenBatch& batch, const void* hidden_in, void* out) override;
  size_t in_flight() const override { return stash_.size(); }
  float* grads() override { return grads_data_.data(); }
  absl::Status ZeroGrads() override;
  absl::Status AddGradSumOfSquares(double* sum) override;
  absl::Status GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) override;
  absl::Status OptimizerStep(const OptimizerStepArgs& args) override;
  absl::Status ShardOptimizer(std::span<const ParamRun> owned) override;
  float* params() override { return params_data_.data(); }
  absl::Status ExportState(StageState* out) override;
  absl::Status ImportState(const StageState& in) override;

  // Forward keeping everything (kNone), returning this micro-batch's loss.
  using Stage::ForwardLoss;
  absl::StatusOr<double> ForwardLoss(int mb, const TokenBatch& batch, const float* hidden_in, float* hidden_out,
                                     float loss_scale) {
    return Stage::ForwardLoss(mb, batch, hidden_in, hidden_out, loss_scale, Recompute::kNone);
  }

  // Host views for CPU-only code (evaluation, reference tests).
  const ParamInfo* FindParam(const std::string& name) const { return layout_.FindParam(name); }
  std::span<float> param_data() { return params_data_; }
  std::span<float> grad_data() { return grads_data_; }
  std::span<const float> param_data() const { return params_data_; }
  std::span<const float> grad_data() const { return grads_data_; }
  bool HasSharedEmbedding() const { return layout_.HasSharedEmbedding(); }
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
  // Fills every activation of layer `l` from a.x; writes the layer's output
  // (N, C) to `out` unless it is null (recomputation needs no output).
  absl::Status LayerForward(const GptLayout::Layer& l, LayerActs& a, const int32_t* segments, int64_t B, int64_t T,
                            float* out);
  absl::StatusOr<Buffer> Get(int64_t floats);
  // A tensor's parameters and gradients; null for one the block does not
  // have (GptLayout::kAbsent).
  float* P(size_t offset) { return offset == GptLayout::kAbsent ? nullptr : params_data_.data() + offset; }
  float* G(size_t offset) { return offset == GptLayout::kAbsent ? nullptr : grads_data_.data() + offset; }
  // The block's norm (model.block.norm) over N rows of the hidden size, with
  // gain `w` and shift `b` (absent: none); `mean` is unused by RMS norm.
  void NormForward(float* out, float* mean, float* rstd, const float* x, size_t w, size_t b, int64_t N);
  void NormBackward(float* dx, size_t w, size_t b, const float* dout, const float* x, const float* mean,
                    const float* rstd, int64_t N);
  // The MLP's activation (model.block.mlp): (N, MlpWidth()) -> (N, ffn).
  void ActivationForward(float* act, const float* fc, int64_t N);
  void ActivationBackward(float* dfc, const float* fc, const float* dact, int64_t N);

  GptLayout layout_;
  BufferPool* pool_;
  std::vector<float> params_data_, grads_data_;
  // AdamW moments of the owned runs (all parameters unless sharded), packed
  // in their order.
  std::vector<ParamRun> owned_;
  std::vector<float> m_, v_;
  std::map<int, std::unique_ptr<Stash>> stash_;
  double loss_total_ = 0;  // TakeLoss
  static constexpr int kInferKey = -1;  // Infer's private stash key
};

}  // namespace dynapipe::runtime::model
