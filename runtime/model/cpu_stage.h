#pragma once

// What every model's pipeline stage on the CPU backend shares, whatever its
// layers: fp32 parameters, gradients and AdamW moments in host memory over
// the layout's flat arrays (the optimizer, ZeRO-1's shards, checkpoints'
// state, the gradient norm), activations from a BufferPool, the loss total,
// and the block's norm and feed-forward activation (model.block) over rows.
// GptStage (gpt.h) and T5Stage (t5.h) add their forward and backward.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/layout.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::model {

class CpuStageBase : public Stage {
 public:
  // Stage.
  const GptLayout& layout() const override { return layout_; }
  DType activation_dtype() const override { return DType::kF32; }
  size_t state_bytes() const override { return (2 * layout_.num_params() + m_.size() + v_.size()) * sizeof(float); }
  absl::StatusOr<double> TakeLoss() override;
  float* grads() override { return grads_data_.data(); }
  absl::Status ZeroGrads() override;
  absl::Status AddGradSumOfSquares(double* sum) override;
  absl::Status GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) override;
  absl::Status OptimizerStep(const OptimizerStepArgs& args) override;
  absl::Status ShardOptimizer(std::span<const ParamRun> owned) override;
  float* params() override { return params_data_.data(); }
  absl::Status ExportState(StageState* out) override;
  absl::Status ImportState(const StageState& in) override;

  // Host views for CPU-only code (evaluation, reference tests).
  const ParamInfo* FindParam(const std::string& name) const { return layout_.FindParam(name); }
  std::span<float> param_data() { return params_data_; }
  std::span<float> grad_data() { return grads_data_; }
  std::span<const float> param_data() const { return params_data_; }
  std::span<const float> grad_data() const { return grads_data_; }
  bool HasSharedEmbedding() const { return layout_.HasSharedEmbedding(); }

 protected:
  // Initialises the parameters from the layout's rules; `pool` holds the
  // activations and must outlive the stage.
  CpuStageBase(GptLayout layout, BufferPool* pool);

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
  double loss_total_ = 0;  // TakeLoss

 private:
  // AdamW moments of the owned runs (all parameters unless sharded), packed
  // in their order.
  std::vector<ParamRun> owned_;
  std::vector<float> m_, v_;
};

}  // namespace dynapipe::runtime::model
