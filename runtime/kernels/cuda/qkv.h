#pragma once

// The attention's input projection [q | k | v] between its product and the
// attention kernels (runtime/model/gpt_cuda_layers.cc), on bf16 rows with
// fp32 arithmetic: rotary positions on the queries and keys (Llama's RoPE),
// and grouped-query attention's key-value heads repeated for the multi-head
// kernels, their gradients summed back (qkv_layout.h). Launchers are
// asynchronous on `stream` and return the launch status. Positions are
// trusted to be >= 0 (not checked on the device, as the embedding's).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// Rotary position embedding in place, as cpu::RotaryApply (Hugging Face's
// Llama, "rotate half"): in each of the first `heads` heads of hs values of
// row n (queries then keys of a [q | k | v] row are adjacent), the pair (i,
// i + hs/2) is rotated by angle positions[n] * base^(-2i / hs), a' = a cos -
// b sin, b' = b cos + a sin; `inverse` rotates by the negative angle (the
// backward: gradients of the rotated values in, of the inputs out). Angles,
// cos and sin in double, the rotation in fp32 (one rounding per element).
absl::Status RotaryApply(__nv_bfloat16* x,          // (N, stride), heads x hs from each row's start rotated
                         const int32_t* positions,  // (N) device
                         int64_t N, int64_t stride, int64_t heads, int64_t hs, double base, bool inverse,
                         cudaStream_t stream);

// Grouped-query attention's row [q | k | v] (C + 2 kv_heads hs per token)
// into the multi-head row (3C), each kv head repeated for the heads /
// kv_heads query heads that read it (GroupedQkv::Source): a copy, bit for
// bit. out must not overlap in.
absl::Status ExpandKvHeads(__nv_bfloat16* out,        // (N, 3C)
                           const __nv_bfloat16* in,   // (N, C + 2 kv_heads hs)
                           int64_t N, int64_t C, int64_t heads, int64_t kv_heads, cudaStream_t stream);

// The backward of ExpandKvHeads: out = the queries' gradient as it is, each
// kv head's the sum of its query heads' (GroupedQkv::Sources; summed in
// fp32, rounded once). Written, not accumulated. out must not overlap in.
absl::Status ReduceKvHeads(__nv_bfloat16* out,        // (N, C + 2 kv_heads hs)
                           const __nv_bfloat16* in,   // (N, 3C)
                           int64_t N, int64_t C, int64_t heads, int64_t kv_heads, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
