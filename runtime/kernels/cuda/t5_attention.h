#pragma once

// Attention in the forms T5 needs, on bf16 activations with fp32 softmax:
// self-attention bidirectional (encoder) or causal (decoder), and
// cross-attention (decoder queries, encoder keys and values); scores scaled
// or not, plus T5's relative position bias, one (buckets, NH) table per
// stack. Same semantics as cpu::AttentionForward / CrossAttentionForward
// with cpu::AttentionOptions: query (b, i) attends to key (b, j) iff
// seg_q[b, i] == seg_k[b, j] >= 0 (and j <= i when causal); a query with no
// such key (padding) outputs 0 and gets no gradient.
//
// Flash-style (nothing of size T^2 is stored: forward keeps each query's
// log-sum-exp; backward recomputes the probabilities), on CUDA cores: a warp
// per (token, head), its lanes taking 32 keys (or queries) at a time, so a
// query only visits the range of keys MakeAttentionRanges gives it
// (attention_ranges.h). Backward is two kernels without atomics on the
// activations: per query D = rowsum(dO * O) and dq; then per key dk and dv;
// the bias table's gradient is summed per warp in shared memory and added
// with fp32 atomics (so it is not bitwise deterministic from run to run).
//
// This is the first CUDA version for T5: correct first, not yet on tensor
// cores (GPT's attention is: attention.h, cudnn_attention.h).
// Launchers are asynchronous on `stream` and return the launch status.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// The operands of one attention. Head h of token n (row-major over (B, T))
// is at q + n * ldq + h * hs, likewise k and v with ldkv (hs = C / NH in
// {32, 64, 128}); so self-attention passes qkv, qkv + C, qkv + 2C with
// ld 3C, and cross-attention q (ld C) and kv, kv + C (ld 2C). Every q, k, v
// pointer and leading dimension must keep rows 16-byte aligned.
struct T5AttentionArgs {
  const __nv_bfloat16* q = nullptr;
  int64_t ldq = 0;
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* v = nullptr;
  int64_t ldkv = 0;
  const int32_t* seg_q = nullptr;         // (B, Tq) device
  const int32_t* seg_k = nullptr;         // (B, Tk) device
  const int32_t* key_ranges = nullptr;    // (B * Tq, 2) device: AttentionRanges::keys
  const int32_t* query_ranges = nullptr;  // (B * Tk, 2) device: AttentionRanges::queries (backward)
  int64_t B = 0, Tq = 0, Tk = 0, C = 0, NH = 0;
  bool causal = false;  // self-attention only (Tq == Tk)
  float scale = 1.0f;   // times q.k; T5: 1
  // T5's bias: score += bias[bucket_of[j - i + Tq - 1] * NH + h]; null: none.
  const __nv_bfloat16* bias = nullptr;  // (buckets, NH) device
  const int32_t* bucket_of = nullptr;   // (Tq + Tk - 1) device: RelativeBucketTable
  int buckets = 0;                      // <= kMaxT5Buckets
};

inline constexpr int kMaxT5Buckets = 2048;

// out = softmax(scale q k^T + bias, masked) v per head; lse = each query's
// log-sum-exp of its visible scores (0 where none).
absl::Status T5AttentionForward(const T5AttentionArgs& a,
                                __nv_bfloat16* out,  // (B * Tq, C)
                                float* lse,          // (B * Tq, NH)
                                cudaStream_t stream);

// dq, dk, dv += the gradient (each row read, added in fp32, rounded once;
// they have q's and k's leading dimensions, and may be the column blocks of
// one dqkv); dbias += the bias table's gradient (fp32, may be null without
// a bias). `scratch`: B * Tq * NH floats.
absl::Status T5AttentionBackward(const T5AttentionArgs& a,
                                 const __nv_bfloat16* out,   // (B * Tq, C) the forward's output
                                 const float* lse,           // (B * Tq, NH) the forward's
                                 const __nv_bfloat16* dout,  // (B * Tq, C)
                                 __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                                 float* dbias,    // (buckets, NH), += or null
                                 float* scratch,  // (B * Tq * NH)
                                 cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
