#pragma once

// Causal multi-head self-attention over padded and packed micro-batches, fused
// and tiled (FlashAttention-2 style, bf16 tensor cores, fp32 softmax).
// qkv holds [q | k | v] per token, head h of q at columns [h*hs, (h+1)*hs)
// (k and v likewise after offsets C and 2C), hs = C / NH in {32, 64, 128}.
// Token i of row b attends to token j iff j <= i and seg[b,i] == seg[b,j] >= 0;
// padding (seg < 0) gets output 0 and no gradient. Same semantics as
// cpu::AttentionForward / AttentionBackward. Launchers are asynchronous on
// `stream` and return the launch status.
//
// Alignment: every pointer argument (lse, seg and scratch included) must be
// 16-byte aligned (cudaMalloc's and pool blocks are); the launchers return
// INVALID_ARGUMENT otherwise. T <= 65536. Head size 128 needs more shared
// memory per block than sm_86/sm_89 devices allow (FAILED_PRECONDITION).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/kernels/cuda/attention_tiles.h"

namespace dynapipe::runtime::cuda {

// How masked work is treated; both give identical results (masked pairs
// contribute exact zeros), they differ in cost.
enum class AttentionMode {
  // Skips every tile pair whose (query, key) pairs are all masked: padding and
  // pairs across the samples of a packed row cost (almost) nothing.
  kVarlen,
  // Computes every causal tile pair of the row and masks per pair, as
  // Megatron-LM's masked attention over packed rows does.
  kMaterialized,
};

// out = softmax(q k^T / sqrt(hs), masked) v per head; lse = the logsumexp of
// each query's scaled visible scores (0 for padding queries), for backward.
absl::Status AttentionForward(__nv_bfloat16* out,        // (B, T, C)
                              float* lse,                // (B, NH, T)
                              const __nv_bfloat16* qkv,  // (B, T, 3C)
                              const int32_t* seg,        // (B, T)
                              int64_t B, int64_t T, int64_t C, int64_t NH, AttentionMode mode, cudaStream_t stream);

// fp32 elements of the scratch AttentionBackward needs (B * NH * T).
int64_t AttentionBackwardScratchElements(int64_t B, int64_t T, int64_t C, int64_t NH);

// dqkv += the gradient of the forward (flash-style: P recomputed from lse).
// dq, dk, dv are accumulated in fp32 and added into the bf16 dqkv once;
// padding tokens' dqkv is left untouched. Deterministic (no atomics).
absl::Status AttentionBackward(__nv_bfloat16* dqkv,        // (B, T, 3C), +=
                               const __nv_bfloat16* dout,  // (B, T, C)
                               const __nv_bfloat16* qkv,   // (B, T, 3C)
                               const __nv_bfloat16* out,   // (B, T, C) the forward's output
                               const float* lse,           // (B, NH, T) the forward's lse
                               const int32_t* seg,         // (B, T)
                               int64_t B, int64_t T, int64_t C, int64_t NH, AttentionMode mode,
                               float* scratch,  // (AttentionBackwardScratchElements)
                               cudaStream_t stream);

// Host only: the (query tile, key tile) pairs the forward computes for this
// batch under `mode` (tiles of kAttentionTile tokens; each backward kernel
// computes the same pairs). seg_host is a host array (B, T).
int64_t AttentionTileWork(const int32_t* seg_host, int64_t B, int64_t T, AttentionMode mode);

}  // namespace dynapipe::runtime::cuda
