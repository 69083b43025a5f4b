#include "runtime/kernels/cuda/ragged.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dynapipe::runtime::cuda {
namespace {

int64_t PowerOfTwoAtLeast(int64_t n, int64_t floor) {
  int64_t p = floor;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

absl::StatusOr<RaggedSequences> FindSequences(const int32_t* seg, int64_t B, int64_t T) {
  if (B < 0 || T < 0) return absl::InvalidArgumentError(absl::StrCat("FindSequences: bad shape ", B, " x ", T));
  RaggedSequences out;
  std::vector<int32_t> seen;  // ids already closed in this row
  for (int64_t b = 0; b < B; ++b) {
    seen.clear();
    const int32_t* row = seg + b * T;
    for (int64_t t = 0; t < T;) {
      const int32_t id = row[t];
      int64_t end = t + 1;
      while (end < T && row[end] == id) ++end;
      if (id >= 0) {
        if (std::find(seen.begin(), seen.end(), id) != seen.end()) {
          return absl::FailedPreconditionError(
              absl::StrCat("row ", b, ": segment ", id, " appears in two separate runs (again at column ", t, ")"));
        }
        seen.push_back(id);
        out.len.push_back(static_cast<int32_t>(end - t));
        out.start.push_back(b * T + t);
        out.max_len = std::max(out.max_len, end - t);
      }
      t = end;
    }
  }
  return out;
}

RaggedBucket BucketFor(const RaggedSequences& s) {
  return {PowerOfTwoAtLeast(s.count(), kMinBucketSequences), PowerOfTwoAtLeast(s.max_len, kMinBucketLength)};
}

std::vector<int32_t> BucketLengths(const RaggedSequences& s, const RaggedBucket& bucket) {
  std::vector<int32_t> out(static_cast<size_t>(std::max(bucket.sequences, s.count())), 0);
  std::copy(s.len.begin(), s.len.end(), out.begin());
  return out;
}

std::vector<int64_t> RaggedOffsets(const RaggedSequences& s, const RaggedBucket& bucket, int64_t token_stride) {
  const int64_t n = std::max(bucket.sequences, s.count());
  std::vector<int64_t> out(static_cast<size_t>(n + 1), 0);
  int64_t end = 0;
  for (int64_t i = 0; i < s.count(); ++i) {
    out[i] = s.start[i] * token_stride;
    end = (s.start[i] + s.len[i]) * token_stride;
  }
  for (int64_t i = s.count(); i <= n; ++i) out[i] = end;
  return out;
}

}  // namespace dynapipe::runtime::cuda
