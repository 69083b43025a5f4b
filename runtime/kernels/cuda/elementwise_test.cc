// The element-wise kernels against host references on the same bf16 values.
// Each result is an fp32 sum of two bf16 values rounded once to nearest even,
// which the host reproduces bit for bit, so the checks are exact.

#include "runtime/kernels/cuda/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/kernels/cuda/test_util.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::bf16;
using testing::Bits;
using testing::DeviceArray;
using testing::HostBf16;
using testing::HostF32;
using testing::RandomNormal;
using testing::RelativeError;
using testing::Stream;
using testing::ToBf16;
using testing::ToF32;

// Elements whose bf16 bits differ.
int64_t Mismatches(const std::vector<bf16>& got, const std::vector<bf16>& want) {
  REQUIRE(got.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += Bits(got[i]) != Bits(want[i]);
  return bad;
}

bf16 Sum(bf16 a, bf16 b) { return HostBf16(HostF32(a) + HostF32(b)); }

void CheckResidualAdd(int64_t n, uint64_t seed) {
  INFO("n=" << n);
  // Different scales, so the sums round (a pure bf16 copy would not).
  const std::vector<bf16> a = ToBf16(RandomNormal(n, seed, 3.0f)), b = ToBf16(RandomNormal(n, seed + 1, 0.1f));
  std::vector<bf16> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = Sum(a[i], b[i]);
  Stream stream;
  DeviceArray<bf16> da(a), db(b), out(std::vector<bf16>(n, HostBf16(-7.0f)));
  REQUIRE_OK(ResidualAdd(out.get(), da.get(), db.get(), n, stream.get()));
  const std::vector<bf16> got = out.Download();
  CHECK(Mismatches(got, want) == 0);
  CHECK(RelativeError(ToF32(got), ToF32(want)) <= 1e-2);
  // In place, either operand: the residual stream is updated this way.
  REQUIRE_OK(ResidualAdd(da.get(), da.get(), db.get(), n, stream.get()));
  CHECK(Mismatches(da.Download(), want) == 0);
  DeviceArray<bf16> da2(a);
  REQUIRE_OK(ResidualAdd(db.get(), da2.get(), db.get(), n, stream.get()));
  CHECK(Mismatches(db.Download(), want) == 0);
}

TEST_CASE("ResidualAdd adds in fp32 and rounds once, in place too", "[gpu]") {
  CheckResidualAdd(1, 11);
  CheckResidualAdd(255, 12);
  CheckResidualAdd(100003, 13);  // not a multiple of the block
}

TEST_CASE("AddF32 matches the host's fp32 sum bit for bit, in place too", "[gpu]") {
  Stream stream;
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    INFO("n=" << n);
    // Different scales, so the sums round.
    const std::vector<float> a = RandomNormal(n, 31 + n, 5.0f), b = RandomNormal(n, 32 + n, 1e-3f);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    DeviceArray<float> da(a), db(b), out(std::vector<float>(n, -7.0f));
    REQUIRE_OK(AddF32(out.get(), da.get(), db.get(), n, stream.get()));
    const std::vector<float> got = out.Download();
    CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
    CHECK(got != a);  // the addend mattered
    // In place into the first operand: the backend's SumPair does this.
    REQUIRE_OK(AddF32(da.get(), da.get(), db.get(), n, stream.get()));
    const std::vector<float> in_place = da.Download();
    CHECK(std::memcmp(in_place.data(), want.data(), n * sizeof(float)) == 0);
  }
  CHECK(AddF32(nullptr, nullptr, nullptr, 0, nullptr).ok());
  CHECK(AddF32(nullptr, nullptr, nullptr, -1, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(AddF32(nullptr, nullptr, nullptr, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
}

// Distinct rows in [0, N), shuffled.
std::vector<int32_t> DistinctRows(int64_t N, int64_t M, uint64_t seed) {
  REQUIRE(M <= N);
  std::vector<int32_t> all(N);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(M);
  return all;
}

void CheckGatherScatter(int64_t N, int64_t M, int64_t C, uint64_t seed) {
  INFO("N=" << N << " M=" << M << " C=" << C);
  Stream stream;
  const std::vector<bf16> in = ToBf16(RandomNormal(N * C, seed, 2.0f));
  // Gather with repeated rows (allowed) and the first and last row.
  std::vector<int32_t> rows(M);
  std::mt19937_64 rng(seed + 1);
  for (int64_t r = 0; r < M; ++r) rows[r] = static_cast<int32_t>(rng() % N);
  rows[0] = static_cast<int32_t>(N - 1);
  if (M > 1) rows[M - 1] = 0;
  if (M > 2) rows[1] = rows[2];
  std::vector<bf16> want(M * C);
  for (int64_t r = 0; r < M; ++r) std::copy_n(in.begin() + rows[r] * C, C, want.begin() + r * C);
  DeviceArray<bf16> d_in(in), d_out(std::vector<bf16>(M * C, HostBf16(5.0f)));
  DeviceArray<int32_t> d_rows(rows);
  REQUIRE_OK(GatherRows(d_out.get(), d_in.get(), d_rows.get(), M, C, stream.get()));
  CHECK(Mismatches(d_out.Download(), want) == 0);

  // Scatter-add M distinct rows into a non-zero destination; the other rows
  // must stay untouched.
  const std::vector<int32_t> distinct = DistinctRows(N, M, seed + 2);
  const std::vector<bf16> src = ToBf16(RandomNormal(M * C, seed + 3, 0.25f));
  std::vector<bf16> dst = in, expect = in;
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t c = 0; c < C; ++c) expect[distinct[r] * C + c] = Sum(dst[distinct[r] * C + c], src[r * C + c]);
  }
  DeviceArray<bf16> d_dst(dst), d_src(src);
  DeviceArray<int32_t> d_distinct(distinct);
  REQUIRE_OK(ScatterAddRows(d_dst.get(), d_src.get(), d_distinct.get(), M, C, stream.get()));
  const std::vector<bf16> got = d_dst.Download();
  CHECK(Mismatches(got, expect) == 0);
  CHECK(RelativeError(ToF32(got), ToF32(expect)) <= 1e-2);
}

TEST_CASE("GatherRows copies the indexed rows; ScatterAddRows adds into distinct rows only", "[gpu]") {
  CheckGatherScatter(1, 1, 1, 21);
  CheckGatherScatter(101, 37, 70, 22);    // C not a multiple of 32
  CheckGatherScatter(300, 300, 64, 23);   // every row
  CheckGatherScatter(2000, 999, 257, 24); // M * C not a multiple of the block
}

TEST_CASE("Scale multiplies in fp32 and rounds once, bit for bit", "[gpu]") {
  Stream stream;
  const int64_t n = 100003;
  const std::vector<bf16> x = ToBf16(RandomNormal(n, 41, 3.0f));
  const float s = 1.0f / std::sqrt(96.0f);
  std::vector<bf16> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = HostBf16(HostF32(x[i]) * s);
  DeviceArray<bf16> d(x);
  REQUIRE_OK(Scale(d.get(), s, n, stream.get()));
  stream.Sync();
  CHECK(Mismatches(d.Download(), want) == 0);
  CHECK(Mismatches(want, x) > n / 2);  // not vacuous: most values changed
}

TEST_CASE("Element-wise launchers reject bad sizes and accept empty work before touching the device") {
  CHECK(ResidualAdd(nullptr, nullptr, nullptr, 0, nullptr).ok());
  CHECK(ResidualAdd(nullptr, nullptr, nullptr, -1, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ResidualAdd(nullptr, nullptr, nullptr, 8, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(Scale(nullptr, 2.0f, 0, nullptr).ok());
  CHECK(Scale(nullptr, 2.0f, 5, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(GatherRows(nullptr, nullptr, nullptr, 0, 4, nullptr).ok());
  CHECK(GatherRows(nullptr, nullptr, nullptr, -1, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(GatherRows(nullptr, nullptr, nullptr, 3, 0, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(GatherRows(nullptr, nullptr, nullptr, 3, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ScatterAddRows(nullptr, nullptr, nullptr, 0, 4, nullptr).ok());
  CHECK(ScatterAddRows(nullptr, nullptr, nullptr, -2, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ScatterAddRows(nullptr, nullptr, nullptr, 3, -1, nullptr).code() == absl::StatusCode::kInvalidArgument);
  const absl::Status s = ScatterAddRows(nullptr, nullptr, nullptr, 3, 4, nullptr);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("ScatterAddRows") != absl::string_view::npos);
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
