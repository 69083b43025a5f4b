#pragma once

// Host-side tables for the CUDA T5 attention (t5_attention.h): which keys
// each query may attend to and which queries each key may be attended by,
// as index ranges within a row, and the relative-position bucket of every
// key distance. The kernels still test every pair in a range against the
// segments and the causal mask, so a range only has to contain every
// visible pair: rows whose segments come back after another stay exact.
// Host-only; the stage uploads the tables with a micro-batch's tokens.

#include <cstdint>
#include <vector>

namespace dynapipe::runtime::cuda {

// Two int32 per token, [lo, hi), row-relative.
struct AttentionRanges {
  std::vector<int32_t> keys;     // (B * Tq, 2): the keys query (b, i) may see
  std::vector<int32_t> queries;  // (B * Tk, 2): the queries that may see key (b, j)
};

// Query (b, i) of segment s >= 0 may see the keys of row b from the first to
// the last of segment s in seg_k (with `causal`, none after i; self-attention
// only, Tq == Tk); `whole_rows` (materialized attention, the packing
// baseline) widens that to the whole row, or its causal prefix, so the
// kernels compute and mask every pair as packing does. Padding (s < 0) sees
// nothing. Key ranges likewise, from seg_q.
AttentionRanges MakeAttentionRanges(const int32_t* seg_q,  // (B, Tq)
                                    const int32_t* seg_k,  // (B, Tk)
                                    int64_t B, int64_t Tq, int64_t Tk, bool causal, bool whole_rows);

// bucket_of[j - i + Tq - 1] = the relative-position bucket of key j seen from
// query i (cpu::RelativePositionBucket: the CPU backend's very buckets), for
// every distance of a (Tq, Tk) grid; Tq + Tk - 1 entries.
std::vector<int32_t> RelativeBucketTable(int64_t Tq, int64_t Tk, bool bidirectional, int buckets, int max_distance);

}  // namespace dynapipe::runtime::cuda
