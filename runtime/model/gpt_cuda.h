#pragma once

// The GPT pipeline stage (runtime/model/gpt.h) on a CUDA device: the same
// model, parameter names, shapes and flat offsets as the CPU GptStage, so
// checkpoints and CPU comparisons line up, computed with the kernels of
// runtime/backend/cuda in mixed precision.
//
// Device state (one cudaMalloc each, P = the stage's parameter count, laid out
// exactly as GptStage::params()): fp32 master weights (P), their bf16 compute
// copy (P), fp32 gradients (P, accumulated across micro-batches), fp32 AdamW
// moments m and v (P each): 18 bytes per parameter. Activations (bf16) and
// their statistics (fp32) come from the buffer pool on the compute stream.
// The CUDA layout needs every tensor's offset to be a multiple of 8 elements
// (16-byte aligned cuBLASLt operands): hidden is a multiple of 32 here, so
// this asks model.ffn to be a multiple of 8.
//
// Every call enqueues work on the compute stream and returns once it is
// queued, except where a value must come back to the host (the last stage's
// loss, GradNormSquared, the Copy*ToHost calls): those wait for the stream,
// polling with a deadline (kHostWaitTimeout) rather than blocking forever.
//
// Device pointers passed in (hidden states and their gradients) must be
// 16-byte aligned, hold HiddenElements(batch) bf16 values, and be ready for
// work queued on the compute stream (their producers ordered before it).
//
// Threads: one thread drives a stage (it owns the stash, the cuBLASLt handle
// and the stream's work).

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
#include "runtime/backend/cuda/attention.h"
#include "runtime/backend/cuda/matmul.h"
#include "runtime/backend/cuda/optimizer.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/gpt.h"

namespace dynapipe::runtime::model {

class CudaGptStage {
 public:
  using bf16 = __nv_bfloat16;

  // How long a host wait for the compute stream may take before the call
  // fails with DEADLINE_EXCEEDED (a hung kernel, a lost device).
  static constexpr std::chrono::seconds kHostWaitTimeout{300};

  // INVALID_ARGUMENT for a config the kernels cannot run (head dimension
  // hidden / heads not 32, 64 or 128; ffn not a multiple of 8) or a bad layer
  // range, before touching the device. Then allocates the device state on the
  // current device and initialises it as the CPU stage does (same seed, same
  // values). `pool` must allocate device memory (CudaAllocator) and outlive
  // the stage; its buffers are taken for `compute_stream`.
  static absl::StatusOr<std::unique_ptr<CudaGptStage>> Create(const GptConfig& config,
                                                              const GptStage::Options& options,
                                                              cudaStream_t compute_stream, BufferPool* pool);
  // Waits for the stream's work (the stash and device state may be in use).
  ~CudaGptStage();
  CudaGptStage(const CudaGptStage&) = delete;
  CudaGptStage& operator=(const CudaGptStage&) = delete;

  const GptConfig& config() const { return config_; }
  const GptStage::Options& options() const { return options_; }
  cudaStream_t stream() const { return stream_; }
  // Names, shapes and flat offsets, identical to the CPU GptStage's.
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo* FindParam(const std::string& name) const;
  // Parameters in the flat arrays (P).
  int64_t num_params() const { return num_params_; }
  // Device arrays (P), for the executor's gradient all-reduces and checks.
  float* device_params() const { return master_; }
  const bf16* device_params_bf16() const { return compute_; }
  float* device_grads() const { return grads_; }
  // As GptStage::HasSharedEmbedding.
  bool HasSharedEmbedding() const { return config_.tie_embeddings && options_.first != options_.last; }
  // Elements of the hidden-state tensor crossing a stage boundary.
  int64_t HiddenElements(const TokenBatch& batch) const { return batch.rows * batch.seq * config_.hidden; }
  // Micro-batches forwarded but not yet backwarded.
  size_t in_flight() const { return stash_.size(); }

  // Gradients = 0 (enqueued).
  absl::Status ZeroGrads();

  // Forward of micro-batch `mb`, as GptStage::Forward: the first stage reads
  // the batch's tokens and positions, later stages `hidden_in` (rows, seq,
  // hidden) bf16 on the device; stages other than the last write `hidden_out`
  // (overwritten; 16-byte aligned). The last stage returns the loss summed
  // over scored tokens, each weighted by `loss_scale`, and therefore waits for
  // the compute stream (one device -> host copy per micro-batch); other stages
  // return 0 without waiting. `hidden_in` is copied into the stash by the
  // first work the call queues, so work queued on the stream afterwards may
  // reuse its slot.
  absl::StatusOr<double> Forward(int mb, const TokenBatch& batch, const bf16* hidden_in, bf16* hidden_out,
                                 float loss_scale);
  // Backward of micro-batch `mb`, accumulating parameter gradients (fp32).
  // `dhidden_out`: gradient of this stage's output (null on the last stage).
  // `dhidden_in`: receives (overwritten) the gradient of the stage input (not
  // written on the first stage; may be null there).
  absl::Status Backward(int mb, const bf16* dhidden_out, bf16* dhidden_in);

  // Sum of squares of every gradient (the tied embedding's copy included, as
  // on the CPU); waits for the stream.
  absl::StatusOr<double> GradNormSquared();
  // One AdamW step over every parameter with the stage's gradients (scaled
  // by p.grad_scale), rewriting the bf16 compute copy. Enqueued.
  absl::Status AdamWStep(const cuda::AdamWParams& p);

  // Master weights / gradients -> host (P floats); waits for the stream.
  absl::Status CopyParamsToHost(std::span<float> out);
  absl::Status CopyGradsToHost(std::span<float> out);
  // Host -> master weights (P floats), and the bf16 copy from them (restoring
  // a checkpoint, or tests starting both backends from the same values).
  // Leaves gradients and moments alone. Enqueued; `in` may be freed on return.
  absl::Status SetParams(std::span<const float> in);

 private:
  struct Stash;
  struct Layer {  // parameter offsets
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
  };
  CudaGptStage(const GptConfig& c, const GptStage::Options& o, cudaStream_t stream, BufferPool* pool);
  absl::Status Init();
  // Waits for the work queued on the stream so far, with the deadline.
  absl::Status WaitStream(const char* what);
  const bf16* W(size_t offset) const { return compute_ + offset; }
  float* G(size_t offset) const { return grads_ + offset; }
  Buffer Get(size_t bytes);

  GptConfig config_;
  GptStage::Options options_;
  cudaStream_t stream_;
  BufferPool* pool_;
  cuda::AttentionMode attention_mode_;
  std::vector<ParamInfo> params_;
  int64_t num_params_ = 0;
  std::vector<Layer> layers_;
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_ = 0;

  std::unique_ptr<cuda::Matmul> matmul_;
  float* master_ = nullptr;  // device (P)
  bf16* compute_ = nullptr;  // device (P)
  float* grads_ = nullptr;   // device (P)
  float* m_ = nullptr;       // device (P)
  float* v_ = nullptr;       // device (P)
  struct HostScalars;
  HostScalars* host_ = nullptr;  // pinned: the loss and the sum of squares coming back
  cudaEvent_t done_ = nullptr;   // for WaitStream
  std::map<int, std::unique_ptr<Stash>> stash_;
};

}  // namespace dynapipe::runtime::model
