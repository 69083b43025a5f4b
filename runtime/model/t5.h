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
// A stage holds any contiguous range of the layers (encoder layers, then
// decoder layers; the boundary inside a stage or between stages). What
// crosses a boundary is GptConfig::BoundaryElements: the encoder's hidden
// state, then its output alone at its end, then the encoder output followed
// by the decoder's hidden state; gradients travel back in the same layout,
// the encoder output's summed over every decoder layer on the way. Tensors
// several stages hold (wte, a stack's bias table) get the sum of their
// copies' gradients from the worker. Recomputation as GptStage's: kSelective
// drops the attention probabilities (self and cross), kFull all but each
// layer's input; backward recomputes them by the same arithmetic, so the
// gradients are bit-identical whatever is kept.

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/kernels/cpu/ops.h"
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

  // Stage (the rest in CpuStageBase).
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
  absl::StatusOr<double> ForwardImpl(int key, const TokenBatch& batch, const float* in, float* out,
                                     float loss_scale, Recompute recompute);
  absl::StatusOr<Buffer> StageInput(Stash& s, const float* in);
  absl::StatusOr<double> Head(Stash& s, Buffer x);
  absl::StatusOr<Buffer> HeadBackward(const Stash& s);
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
  cpu::AttentionOptions<float> SelfAttention(const GptLayout::Layer& l);
  void Drop(LayerActs& a, Recompute recompute);
  absl::Status Restore(const GptLayout::Layer& l, LayerActs& a, const Grid& g, const Grid& enc_grid,
                       const float* enc, Recompute recompute);
  absl::StatusOr<Buffer> Zeros(int64_t floats);
  absl::StatusOr<Buffer> Copy(const float* src, int64_t floats);

  std::map<int, std::unique_ptr<Stash>> stash_;
  static constexpr int kInferKey = -1;
};

}  // namespace dynapipe::runtime::model
