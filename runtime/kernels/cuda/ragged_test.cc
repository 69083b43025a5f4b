#include "runtime/kernels/cuda/ragged.h"

#include <catch2/catch.hpp>
#include <vector>

namespace dynapipe::runtime::cuda {
namespace {

TEST_CASE("FindSequences: padded rows, packed rows, one-token samples and an all-padding row") {
  constexpr int64_t B = 4, T = 6;
  const std::vector<int32_t> seg = {
      0,  0,  0,  0,  -1, -1,  // a padded row: one sequence of 4
      0,  1,  1,  2,  2,  2,   // a packed row: 1, 2 and 3 tokens
      -1, -1, -1, -1, -1, -1,  // all padding: no sequence
      5,  5,  5,  5,  5,  7,   // a full-length sample then a one-token sample
  };
  auto s = FindSequences(seg.data(), B, T);
  REQUIRE(s.ok());
  CHECK(s->len == std::vector<int32_t>{4, 1, 2, 3, 5, 1});
  CHECK(s->start == std::vector<int64_t>{0, 6, 7, 9, 18, 23});
  CHECK(s->max_len == 5);
  CHECK(s->count() == 6);
}

TEST_CASE("FindSequences refuses a segment split in two runs of one row, and an empty batch has none") {
  const std::vector<int32_t> split = {0, 0, 1, 0};
  auto bad = FindSequences(split.data(), 1, 4);
  CHECK(bad.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(bad.status().message().find("segment 0") != absl::string_view::npos);
  // The same id in different rows is two sequences.
  const std::vector<int32_t> two_rows = {3, 3, 3, 3};
  auto ok = FindSequences(two_rows.data(), 2, 2);
  REQUIRE(ok.ok());
  CHECK(ok->len == std::vector<int32_t>{2, 2});
  auto none = FindSequences(nullptr, 0, 0);
  REQUIRE(none.ok());
  CHECK(none->count() == 0);
}

TEST_CASE("buckets round sequences and length up to powers of two, with floors") {
  RaggedSequences s;
  s.len = {3, 100, 65};
  s.start = {0, 3, 103};
  s.max_len = 100;
  CHECK(BucketFor(s) == RaggedBucket{kMinBucketSequences, 128});
  s.len.assign(9, 1);
  s.start.assign(9, 0);
  s.max_len = 1;
  CHECK(BucketFor(s) == RaggedBucket{16, kMinBucketLength});
  s.len.assign(64, 4096);
  s.max_len = 4096;
  CHECK(BucketFor(s) == RaggedBucket{64, 4096});
}

TEST_CASE("ragged offsets are token starts times the token stride; padding sequences are empty at the end") {
  const std::vector<int32_t> seg = {0, 0, 1, -1,  // row 0: tokens 0-1 and 2
                                    -1, 4, 4, 4};  // row 1: tokens 5-7
  auto s = FindSequences(seg.data(), 2, 4);
  REQUIRE(s.ok());
  const RaggedBucket bucket = BucketFor(*s);
  REQUIRE(bucket.sequences == 8);
  const int64_t C = 16;
  const std::vector<int64_t> qkv = RaggedOffsets(*s, bucket, 3 * C);
  REQUIRE(qkv.size() == 9);
  CHECK(qkv[0] == 0);
  CHECK(qkv[1] == 2 * 3 * C);
  CHECK(qkv[2] == 5 * 3 * C);
  for (size_t i = 3; i < qkv.size(); ++i) CHECK(qkv[i] == 8 * 3 * C);  // past token 7
  const std::vector<int64_t> stats = RaggedOffsets(*s, bucket, 4);  // 4 heads, token-major
  CHECK(stats[2] == 5 * 4);
  const std::vector<int32_t> lens = BucketLengths(*s, bucket);
  CHECK(lens == std::vector<int32_t>{2, 1, 3, 0, 0, 0, 0, 0});
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
