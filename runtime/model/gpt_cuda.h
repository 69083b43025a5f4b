#pragma once

// The GPT pipeline stage (runtime/model/stage.h) on a CUDA device: the model,
// parameter names, shapes, flat offsets, parameter groups and initial values
// of runtime/model/layout.h, computed with the kernels of
// runtime/kernels/cuda in mixed precision, so checkpoints and comparisons
// with the CPU stage (runtime/model/gpt.h) line up.
//
// Device state, the optimizer, losses and host copies: CudaStageBase
// (cuda_stage.h).
//
// Llama-style blocks (model.block): rotary positions rotate the queries and
// keys right after the qkv product (no position table: the embedding is the
// token's row alone), as the CPU stage does, and every stage rotates with the
// batch's positions; grouped-query attention repeats each kv head for the
// query heads that read it and runs the multi-head attention kernels (tiled
// or cuDNN's) unchanged, the kv heads' gradients summed back.
//
// Recompute: kFull keeps only each layer's input and runs the layer's
// forward again in Backward. kSelective is the same as kNone here: the
// attention already keeps only its log-sum-exp (flash-style) and recomputes
// the probabilities in its backward, so there is nothing more to drop.
//
// Device pointers passed in (hidden states, their gradients, logits) are
// bf16, must be 16-byte aligned and ready for work queued on the compute
// stream (their producers ordered before it).
//
// Threads: one thread drives a stage (it owns the stash too), with the
// stage's device current.

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
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cuda_stage.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::model {

class CudaGptStage final : public CudaStageBase {
 public:
  // INVALID_ARGUMENT for a config the kernels cannot run (head dimension
  // hidden / heads not 32, 64 or 128; ffn not a multiple of 8; kv heads not
  // dividing the heads) or a bad layer range, before touching the device.
  // Then allocates the device state on the current device and initialises it
  // from the layout (GptLayout::Initialize: the CPU stage's values, bit for
  // bit). `pool` must allocate device memory (CudaAllocator) and outlive the
  // stage; its buffers are taken for `compute_stream`. `wait_timeout` bounds
  // every host wait for the stream.
  static absl::StatusOr<std::unique_ptr<CudaGptStage>> Create(const GptConfig& config, const StageOptions& options,
                                                              cudaStream_t compute_stream, BufferPool* pool,
                                                              absl::Duration wait_timeout = absl::Minutes(5),
                                                              CudaKernels kernels = {});
  ~CudaGptStage() override;
  CudaGptStage(const CudaGptStage&) = delete;
  CudaGptStage& operator=(const CudaGptStage&) = delete;

  // Stage. Tensors crossing the interface are bf16 device pointers:
  // hidden_in, hidden_out, dhidden_out, dhidden_in (rows, seq, hidden); the
  // last stage's Infer output (rows * seq, vocab).
  // Enqueued, never waits: the last stage's loss stays on the device, in one
  // slot per micro-batch, until TakeLoss. `hidden_in` is copied into the
  // stash by the first work the call queues.
  absl::Status Forward(int mb, const TokenBatch& batch,
                       const void* hidden_in,  // (B, T, C) bf16, or null on the first stage
                       void* hidden_out,       // (B, T, C) bf16, or null on the last stage
                       float loss_scale, Recompute recompute) override;
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
  // CUDA-specific views (tests, the profiler).
  // Elements of the hidden-state tensor crossing a stage boundary.
  int64_t HiddenElements(const TokenBatch& batch) const { return batch.rows * batch.seq * config().hidden; }

 private:
  struct Stash;
  struct LayerActs;
  CudaGptStage(GptLayout layout, cudaStream_t stream, BufferPool* pool, std::chrono::seconds wait_timeout,
               CudaKernels kernels);
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
  // Fills every activation of layer `l` from a.x; writes the layer's output
  // to `out` unless it is null (recomputation needs no output).
  absl::Status LayerForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s,
                            bf16* out);  // (B, T, C) or null
  // The attention's input a.qkv (N, 3C) from a.ln1: the qkv product (N,
  // QkvWidth()), its queries and keys rotated (rotary positions), its kv
  // heads repeated per query head (grouped-query attention). The gradient's
  // way back from g.dqkv (N, 3C): kv heads summed (into g.dqkv_grouped),
  // the rotation undone, in place; returns the qkv product's gradient.
  absl::Status QkvForward(const GptLayout::Layer& l, LayerActs& a, const Stash& s);
  absl::StatusOr<const bf16*> QkvGradient(LayerGrads& g, const Stash& s);
  // Rotary positions on the queries and keys of rows of the qkv product
  // (inverse: on their gradients); nothing with learned positions.
  absl::Status Rotate(bf16* qkv,  // (N, QkvWidth())
                      const Stash& s, bool inverse);
  // Whether the model has fewer kv heads than query heads.
  bool Grouped() const { return config().KvHeads() != config().heads; }
  // The layer's attention, forward and backward, through cuDNN where the
  // stash holds a batch for it, else the tiled kernel.
  absl::Status AttentionForward(LayerActs& a, const Stash& s);
  absl::Status AttentionBackward(bf16* dqkv, const bf16* datty, const LayerActs& a, const Stash& s);
  // The stash's cuDNN batch (uploaded on the stream), or none where the
  // micro-batch takes the tiled kernel; the first reason for that is logged.
  absl::Status PrepareCudnnBatch(const TokenBatch& batch, Stash& s);

  cuda::AttentionMode attention_mode_;
  std::string tiled_reason_;  // why the last micro-batch took the tiled kernel (logged when it changes)
  std::map<int, std::unique_ptr<Stash>> stash_;
};

}  // namespace dynapipe::runtime::model
