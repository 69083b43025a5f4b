#include "runtime/kernels/cuda/attention_ranges.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "runtime/kernels/cpu/ops.h"

namespace dynapipe::runtime::cuda {
namespace {

// [first, last + 1) of each segment id >= 0 in one row.
using Extents = absl::flat_hash_map<int32_t, std::pair<int32_t, int32_t>>;

Extents RowExtents(const int32_t* seg, int64_t T) {
  Extents e;
  for (int64_t t = 0; t < T; ++t) {
    if (seg[t] < 0) continue;
    auto [it, fresh] = e.try_emplace(seg[t], static_cast<int32_t>(t), static_cast<int32_t>(t + 1));
    if (!fresh) it->second.second = static_cast<int32_t>(t + 1);
  }
  return e;
}

// For each token of `from` (one row of T_from), the range of `to` (T_to) it
// may pair with; `prefix`: at most up to itself (a causal query's keys);
// `suffix`: from itself on (a causal key's queries).
void RowRanges(int32_t* out, const int32_t* from, int64_t T_from, const int32_t* to, int64_t T_to, bool prefix,
               bool suffix, bool whole_rows) {
  const Extents extents = RowExtents(to, T_to);
  for (int64_t t = 0; t < T_from; ++t) {
    int32_t lo = 0, hi = 0;
    if (from[t] >= 0) {
      if (whole_rows) {
        hi = static_cast<int32_t>(T_to);
      } else if (auto it = extents.find(from[t]); it != extents.end()) {
        lo = it->second.first;
        hi = it->second.second;
      }
      if (prefix) hi = std::min(hi, static_cast<int32_t>(t + 1));
      if (suffix) lo = std::max(lo, static_cast<int32_t>(t));
      if (lo >= hi) lo = hi = 0;
    }
    out[2 * t] = lo;
    out[2 * t + 1] = hi;
  }
}

}  // namespace

AttentionRanges MakeAttentionRanges(const int32_t* seg_q, const int32_t* seg_k, int64_t B, int64_t Tq, int64_t Tk,
                                    bool causal, bool whole_rows) {
  AttentionRanges r;
  r.keys.assign(static_cast<size_t>(2 * B * Tq), 0);
  r.queries.assign(static_cast<size_t>(2 * B * Tk), 0);
  for (int64_t b = 0; b < B; ++b) {
    RowRanges(r.keys.data() + 2 * b * Tq, seg_q + b * Tq, Tq, seg_k + b * Tk, Tk, causal, false, whole_rows);
    RowRanges(r.queries.data() + 2 * b * Tk, seg_k + b * Tk, Tk, seg_q + b * Tq, Tq, false, causal, whole_rows);
  }
  return r;
}

std::vector<int32_t> RelativeBucketTable(int64_t Tq, int64_t Tk, bool bidirectional, int buckets, int max_distance) {
  std::vector<int32_t> table(static_cast<size_t>(std::max<int64_t>(Tq + Tk - 1, 0)));
  for (int64_t d = -(Tq - 1); d <= Tk - 1; ++d) {
    table[d + Tq - 1] = cpu::RelativePositionBucket(static_cast<int>(d), bidirectional, buckets, max_distance);
  }
  return table;
}

}  // namespace dynapipe::runtime::cuda
