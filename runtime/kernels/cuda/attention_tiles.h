#pragma once

// Which (query tile, key tile) pairs the attention kernels compute. Plain
// constexpr C++ on purpose: the host (AttentionTileWork, tests, the planner)
// and the kernels (nvcc --expt-relaxed-constexpr lets device code call
// constexpr functions) run the same code, so host counts and device skipping
// cannot drift apart.

#include <cstdint>

namespace dynapipe::runtime::cuda {

// Query and key tiles are kAttentionTile tokens of one row.
inline constexpr int kAttentionTile = 64;

// [lo, hi] of the segment ids (>= 0) present in one tile; lo > hi when the
// tile holds only padding (or lies past the end of the row).
struct TileSegRange {
  int32_t lo;
  int32_t hi;
};

constexpr TileSegRange EmptyTileSegRange() { return TileSegRange{INT32_MAX, -1}; }

// `r` extended by one token's segment id (padding, seg < 0, changes nothing).
constexpr TileSegRange ExtendTileSegRange(TileSegRange r, int32_t seg) {
  if (seg < 0) return r;
  return TileSegRange{seg < r.lo ? seg : r.lo, seg > r.hi ? seg : r.hi};
}

constexpr TileSegRange MergeTileSegRanges(TileSegRange a, TileSegRange b) {
  return TileSegRange{a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}

// Whether the kernels compute the (q_tile, k_tile) pair of one row. Causal:
// never a key tile after the query tile. Materialized: every other pair.
// Varlen: only pairs whose segment ranges overlap; a skipped pair holds no
// (query, key) pair with equal segment ids, whatever the order of the
// segments, so skipping never changes a result (contiguous segments only make
// it skip more).
constexpr bool TilePairComputed(bool varlen, int64_t q_tile, int64_t k_tile, TileSegRange q, TileSegRange k) {
  if (k_tile > q_tile) return false;
  if (!varlen) return true;
  return q.lo <= q.hi && k.lo <= k.hi && k.lo <= q.hi && q.lo <= k.hi;
}

}  // namespace dynapipe::runtime::cuda
