#pragma once

// Internal to the gpt_cuda target: what CudaGptStage keeps between a
// micro-batch's forward and backward, shared by gpt_cuda.cc (creation,
// attention) and gpt_cuda_layers.cc (forward, backward).

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/memory/buffer_pool.h"
#include "runtime/model/gpt_cuda.h"

namespace dynapipe::runtime::model {

// What backward needs from one layer's forward (device buffers from the
// pool, on the compute stream). Mirrors GptStage's, except that the
// attention keeps its log-sum-exp instead of the probabilities. With
// Recompute::kFull only x survives forward.
struct CudaGptStage::LayerActs {
  Buffer x;                        // layer input (N, C) bf16
  Buffer ln1, ln1_mean, ln1_rstd;  // (N, C) bf16, (N), (N) fp32
  Buffer qkv;                      // (N, 3C) bf16, what the attention reads (QkvForward)
  Buffer atty, lse;                // (N, C) bf16, (B, NH, T) fp32 (tiled) or (N, NH) (cuDNN)
  Buffer x2;                       // after the attention residual (N, C) bf16
  Buffer ln2, ln2_mean, ln2_rstd;  // as ln1
  Buffer fc, gelu;                 // (N, F) bf16 each
};

// What backward needs from one micro-batch's forward. The head's logits are
// not kept at all (recomputed in Backward).
struct CudaGptStage::Stash {
  int64_t rows = 0, seq = 0;
  // Device int32: tokens, positions, segments (N each), then on the last
  // stage the scored token indices and their targets (M each).
  Buffer ints;
  // Its host source, kept with the stash (see RunForward).
  std::vector<int32_t> host_ints;
  const int32_t* tokens = nullptr;     // (N) device
  const int32_t* positions = nullptr;  // (N) device
  const int32_t* segments = nullptr;   // (N) device
  const int32_t* scored = nullptr;     // (M) device
  const int32_t* targets = nullptr;    // (M) device
  // cuDNN's description of the micro-batch's sequences (host) and its
  // device copy, where cuDNN's attention runs it.
  std::optional<cuda::CudnnAttentionBatch> cudnn;
  std::vector<unsigned char> cudnn_host;
  Buffer cudnn_device;
  cuda::CudnnAttention::DeviceBatch cudnn_arrays;
  std::vector<LayerActs> layers;
  // Last stage: only scored rows go through the head.
  int64_t scored_count = 0;            // M
  Buffer xs, lnf, lnf_mean, lnf_rstd;  // (M, C), (M, C) bf16, (M), (M) fp32
  float loss_scale = 0;
};

}  // namespace dynapipe::runtime::model
