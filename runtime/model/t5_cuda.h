#pragma once

// The T5 encoder-decoder stage (runtime/model/t5.h) on a CUDA device: the
// same layout, boundary tensors, gradients and recomputation contract as
// the CPU T5Stage, computed in mixed precision (bf16 activations, fp32
// master weights, gradients and moments: CudaStageBase) with the kernels of
// runtime/kernels/cuda; attention through t5_attention.h (bidirectional or
// causal self-attention with the stack's relative position bias, and
// cross-attention to the encoder output).
//
// What crosses a stage boundary is GptConfig::BoundaryElements in bf16:
// the encoder's hidden state, then its output alone at its end, then the
// encoder output followed by the decoder's hidden state. Only the scored
// target rows go through the head (as CudaGptStage does).
//
// Recompute: kFull keeps only each layer's input and runs its forward again
// in Backward; kSelective is kNone here, the attention keeping only its
// log-sum-exp already.
//
// Device pointers passed in are bf16, 16-byte aligned, and ready for work
// queued on the compute stream. Threads: one thread drives a stage, with its
// device current.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/kernels/cuda/t5_attention.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cuda_stage.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::model {

class CudaT5Stage final : public CudaStageBase {
 public:
  // INVALID_ARGUMENT for a model that is not an encoder-decoder, a config
  // the kernels cannot run (CudaStageBase::CheckCudaLayout; more than
  // cuda::kMaxT5Buckets relative buckets) or a bad layer range, before
  // touching the device; then allocates and initialises the device state
  // (the CPU stage's initial values, bit for bit). `pool` must allocate
  // device memory and outlive the stage.
  static absl::StatusOr<std::unique_ptr<CudaT5Stage>> Create(const GptConfig& config, const StageOptions& options,
                                                             cudaStream_t compute_stream, BufferPool* pool,
                                                             absl::Duration wait_timeout = absl::Minutes(5),
                                                             CudaKernels kernels = {});
  ~CudaT5Stage() override;
  CudaT5Stage(const CudaT5Stage&) = delete;
  CudaT5Stage& operator=(const CudaT5Stage&) = delete;

  // Stage. hidden_in / hidden_out and their gradients: InputBytes /
  // OutputBytes of bf16. Enqueued; the last stage's loss stays on the device
  // until TakeLoss.
  absl::Status Forward(int mb, const TokenBatch& batch, const void* hidden_in, void* hidden_out, float loss_scale,
                       Recompute recompute) override;
  using Stage::Backward;
  // `ready` hears of every gradient at once, once the whole backward is queued.
  absl::Status Backward(int mb, const void* dhidden_out, void* dhidden_in, const GradsReady& ready) override;
  // Last stage: the decoder's logits (rows * seq, vocab) bf16; else the
  // stage output. Enqueued.
  absl::Status Infer(const TokenBatch& batch, const void* hidden_in, void* out) override;
  size_t in_flight() const override { return stash_.size(); }

 private:
  struct Side;
  struct Stash;
  struct LayerActs;
  struct LayerGrads;
  CudaT5Stage(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
              CudaKernels kernels);
  // The micro-batch's int32 inputs and attention tables to the device.
  absl::Status Upload(const TokenBatch& batch, Stash& s);
  // Every layer of the stage from its input; the last stage's final norm of
  // the scored target rows, else the stage output.
  absl::StatusOr<std::unique_ptr<Stash>> RunForward(const TokenBatch& batch, const bf16* in, bf16* out,
                                                    Recompute recompute);
  absl::Status StageInput(Stash& s, const bf16* in, Buffer* x);
  absl::Status HeadForward(Stash& s, const Buffer& x);
  absl::Status HeadBackward(const Stash& s, bf16* dr);
  // One layer from a.x: self-attention, the decoder's cross-attention to
  // the encoder output, the feed-forward; its output to `out` unless null.
  absl::Status LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, bf16* out);
  // Its backward: `dr` holds the output's gradient and receives the
  // input's; the cross-attention adds the encoder output's into `denc`.
  absl::Status LayerBackward(const GptLayout::Layer& l, LayerActs& a, const Stash& s, bf16* dr, bf16* denc,
                             LayerGrads& g);
  cuda::T5AttentionArgs SelfAttention(const GptLayout::Layer& l, const Stash& s, const bf16* qkv) const;
  cuda::T5AttentionArgs CrossAttention(const Stash& s, const bf16* q, const bf16* kv) const;

  std::map<int, std::unique_ptr<Stash>> stash_;
  static constexpr int kInferKey = -1;
};

}  // namespace dynapipe::runtime::model
