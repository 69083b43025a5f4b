#pragma once

// The T5 encoder-decoder on the CPU backend (model.kind t5): GptLayout's
// encoder-decoder layout (layout.h) over the same flat parameter arrays,
// optimizer and state as GptStage (cpu_stage.h), and the block that
// model.block configures (T5 v1.0: RMS norm, ReLU; v1.1: gated GELU).
//
// A micro-batch holds each sample's input in the encoder grid (rows x
// enc_seq) and its target in the decoder grid (rows x seq), in the same row
// and segment: encoder layers attend bidirectionally within a sample,
// decoder layers causally within a sample and then to that sample's encoder
// output (cross-attention); padding computes nothing that reaches the loss.
// Attention is unscaled, with T5's relative position bias, one (buckets,
// heads) table per stack shared by its layers; the tied head scales by
// hidden^-0.5.
//
// Built: the whole model on one stage, everything kept for backward.
// Create refuses a stage split (the encoder output and the shared tables
// across stages are the next step, docs/executor.md "T5 stages") and
// recomputation, each with one line.

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cpu_stage.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::model {

class T5Stage final : public CpuStageBase {
 public:
  static absl::StatusOr<std::unique_ptr<T5Stage>> Create(const GptConfig& config, const StageOptions& options,
                                                         BufferPool* pool);
  ~T5Stage() override;
  T5Stage(const T5Stage&) = delete;
  T5Stage& operator=(const T5Stage&) = delete;

  // Stage (the rest in CpuStageBase). No hidden state crosses a boundary:
  // hidden_in and hidden_out are unused.
  absl::Status Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out, float loss_scale,
                       Recompute recompute) override;
  using Stage::Backward;
  absl::Status Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) override;
  // `out`: the decoder's logits, (rows * seq, vocab).
  absl::Status Infer(const TokenBatch& batch, const void* hidden_in, void* out) override;
  size_t in_flight() const override { return stash_.size(); }

 private:
  struct LayerActs;
  struct Stash;
  struct Grid;  // one stack's tokens as the kernels see them
  T5Stage(GptLayout layout, BufferPool* pool);
  absl::StatusOr<double> ForwardImpl(int key, const TokenBatch& batch, float loss_scale);
  // One layer: self-attention (bidirectional in the encoder, causal in the
  // decoder), the decoder's cross-attention to `enc` (the encoder output,
  // (rows * enc_seq, C)), the feed-forward; from a.x to `out`.
  absl::Status LayerForward(const GptLayout::Layer& l, LayerActs& a, const Grid& g, const Grid& enc_grid,
                            const float* enc, float* out);
  // Backward of one layer: `dr` holds the gradient of its output and
  // receives that of its input; the cross-attention adds the encoder
  // output's gradient into `denc`.
  absl::Status LayerBackward(const GptLayout::Layer& l, const LayerActs& a, const Grid& g, const Grid& enc_grid,
                             const float* enc, float* dr, float* denc);
  absl::StatusOr<Buffer> Zeros(int64_t floats);

  std::map<int, std::unique_ptr<Stash>> stash_;
  static constexpr int kInferKey = -1;
};

}  // namespace dynapipe::runtime::model
