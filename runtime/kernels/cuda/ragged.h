#pragma once

// A micro-batch's (B, T) token grid as packed ("THD") attention sees it: each
// maximal run of one segment id >= 0 within a row is one sequence, attending
// causally to itself only; padding (segment < 0) belongs to none. cuDNN's
// fused attention takes such a batch as a count of sequences, their lengths
// and, per tensor, the element offset of each sequence's first token
// ("ragged offsets"), so it computes neither padding nor pairs across the
// samples of a packed row. Host-only; the CUDA attention uploads the arrays.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::runtime::cuda {

struct RaggedSequences {
  int64_t max_len = 0;         // the longest sequence
  std::vector<int32_t> len;    // (count) tokens of each sequence
  std::vector<int64_t> start;  // (count) its first token's index in the grid, row * T + column
  int64_t count() const { return static_cast<int64_t>(len.size()); }
};

// The sequences of `seg` (B, T), row by row, left to right.
// FAILED_PRECONDITION where a row holds one segment id in two separate runs
// (the tiled kernel's masks allow that; a sequence cannot express it).
absl::StatusOr<RaggedSequences> FindSequences(const int32_t* seg, int64_t B, int64_t T);

// The shape a cuDNN graph is built for: sequences rounded up to a power of
// two (at least kMinBucketSequences) and the sequence bound to a power of two
// (at least kMinBucketLength), so that the few graphs of a run serve every
// micro-batch. Extra sequences have length 0 and cost nothing; the bound
// only sizes the masks, which the per-sequence lengths cut.
struct RaggedBucket {
  int64_t sequences = 0;
  int64_t max_len = 0;
  bool operator==(const RaggedBucket&) const = default;
};
constexpr int64_t kMinBucketSequences = 8;
constexpr int64_t kMinBucketLength = 64;
RaggedBucket BucketFor(const RaggedSequences& s);

// Per-sequence lengths for `bucket.sequences` sequences (0 past the real ones).
std::vector<int32_t> BucketLengths(const RaggedSequences& s, const RaggedBucket& bucket);

// Ragged offsets of a tensor whose token t starts at element t * token_stride
// (qkv: 3C; out: C; the statistics: heads): bucket.sequences + 1 entries, the
// start of each sequence, then past the last real sequence's end (the padding
// sequences start, empty, there too).
std::vector<int64_t> RaggedOffsets(const RaggedSequences& s, const RaggedBucket& bucket, int64_t token_stride);

}  // namespace dynapipe::runtime::cuda
