#pragma once

// Where grouped-query attention's keys and values sit in a row of the
// attention's input projection, and in the multi-head row the attention
// kernels read. Plain constexpr C++ on purpose (as attention_tiles.h): the
// kernels of qkv.h and the host tests run the same index arithmetic.
//
// A grouped row holds [q (C) | k (kv_heads x hs) | v (kv_heads x hs)], query
// head h reading kv head h / (heads / kv_heads) (cpu::AttentionOptions's
// kv_heads); the expanded row holds [q (C) | k (C) | v (C)], the kv heads
// repeated so that query head h finds its keys and values at h * hs, as the
// multi-head kernels expect.

#include <cstdint>

namespace dynapipe::runtime::cuda {

struct GroupedQkv {
  int64_t C;         // queries per row: heads x hs
  int64_t hs;        // head size
  int64_t heads;     // query heads
  int64_t kv_heads;  // key-value heads, dividing heads

  // Query heads per kv head.
  constexpr int64_t Group() const { return heads / kv_heads; }
  // Elements of a grouped row, and of an expanded one.
  constexpr int64_t Width() const { return C + 2 * kv_heads * hs; }
  constexpr int64_t ExpandedWidth() const { return 3 * C; }

  // The column of a grouped row that column j of the expanded row copies.
  constexpr int64_t Source(int64_t j) const {
    if (j < C) return j;
    const int64_t part = j < 2 * C ? 0 : 1;  // keys, values
    const int64_t r = j - C - part * C;      // within the part: head r / hs, element r % hs
    return C + part * kv_heads * hs + (r / hs / Group()) * hs + r % hs;
  }

  // The columns of an expanded row whose gradients add up into column j of
  // the grouped row: `count` of them, from `first`, `step` apart.
  struct Sum {
    int64_t first, count, step;
  };
  constexpr Sum Sources(int64_t j) const {
    if (j < C) return Sum{j, 1, hs};
    const int64_t kv = kv_heads * hs;
    const int64_t part = j < C + kv ? 0 : 1;
    const int64_t r = j - C - part * kv;  // kv head r / hs, element r % hs
    return Sum{C + part * C + (r / hs) * Group() * hs + r % hs, Group(), hs};
  }
};

}  // namespace dynapipe::runtime::cuda
