// The attention input's glue (qkv.h) against the CPU backend and host
// references on the same bf16 values: rotary positions forward and inverse
// (cpu::RotaryApply), grouped-query attention's kv heads expanded (a copy,
// bit for bit) and their gradients reduced (an fp32 sum the host repeats bit
// for bit).

#include "runtime/kernels/cuda/qkv.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cuda/test_util.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::bf16;
using testing::Bits;
using testing::DeviceArray;
using testing::DownloadBf16;
using testing::HostBf16;
using testing::HostF32;
using testing::RandomNormal;
using testing::RelativeError;
using testing::RoundBf16;
using testing::Stream;
using testing::ToBf16;
using testing::UploadBf16;

// Positions of packed rows of `seq` tokens: samples of the given lengths, each
// restarting at 0, then padding at position 0; the last row's sample starts
// far out (long-context angles).
std::vector<int32_t> PackedPositions(int64_t rows, int64_t seq, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> pos(rows * seq, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = 0;
    for (const int64_t len : lengths) {
      for (int64_t p = 0; p < len && t < seq; ++p) pos[r * seq + t++] = static_cast<int32_t>(p);
    }
  }
  for (int64_t t = 0; t < seq; ++t) pos[(rows - 1) * seq + t] = static_cast<int32_t>(4000 + t);
  return pos;
}

TEST_CASE("RotaryApply matches the CPU forward and inverse; the values past the heads stay put", "[gpu]") {
  for (const int64_t hs : {32, 64, 128}) {
    const int64_t NH = 4, KVH = 2, C = NH * hs, W = C + 2 * KVH * hs, heads = NH + KVH;
    const int64_t rows = 3, seq = 37, N = rows * seq;  // odd sizes
    INFO("head size " << hs);
    const std::vector<int32_t> pos = PackedPositions(rows, seq, {11, 20, 6});
    const std::vector<float> x = RoundBf16(RandomNormal(N * W, static_cast<uint64_t>(hs), 1.5f));
    Stream stream;
    DeviceArray<int32_t> d_pos(pos);
    for (const bool inverse : {false, true}) {
      INFO("inverse " << inverse);
      std::vector<float> want = x;
      cpu::RotaryApply<float>(want.data(), pos.data(), N, W, heads, hs, 10000.0, inverse);
      auto d_x = UploadBf16(x);
      REQUIRE_OK(RotaryApply(d_x.get(), d_pos.get(), N, W, heads, hs, 10000.0, inverse, stream.get()));
      const std::vector<float> got = DownloadBf16(d_x);
      CHECK(RelativeError(got, want) <= 1e-2);
      // Rotated values only: the gradients of the values (past the heads) and
      // tokens at position 0 (angle 0) come out bit for bit as they went in.
      int64_t moved = 0, rotated_diff = 0;
      std::vector<float> got_rot, want_rot;
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t c = 0; c < W; ++c) {
          const int64_t k = n * W + c;
          if (c >= heads * hs || pos[n] == 0) {
            moved += got[k] != x[k];
          } else {
            got_rot.push_back(got[k] - x[k]);
            want_rot.push_back(want[k] - x[k]);
            rotated_diff += want[k] != x[k];
          }
        }
      }
      CHECK(moved == 0);
      CHECK(rotated_diff > 0);
      // The change the rotation makes, on its own (the inputs must not hide it).
      CHECK(RelativeError(got_rot, want_rot) <= 2e-2);
    }
    // Forward then inverse: the input again, within bf16 rounding.
    auto d_x = UploadBf16(x);
    REQUIRE_OK(RotaryApply(d_x.get(), d_pos.get(), N, W, heads, hs, 500000.0, false, stream.get()));
    REQUIRE_OK(RotaryApply(d_x.get(), d_pos.get(), N, W, heads, hs, 500000.0, true, stream.get()));
    CHECK(RelativeError(DownloadBf16(d_x), x) <= 1e-2);
  }
}

// Explicit loops, independent of qkv_layout.h: query head h reads kv head
// h / (NH / KVH), its keys at C + kv * hs, its values at C + KVH hs + kv hs.
TEST_CASE("ExpandKvHeads copies each kv head to its query heads; ReduceKvHeads sums their gradients", "[gpu]") {
  for (const int64_t KVH : {1, 2, 4}) {
    const int64_t NH = 4, hs = 64, C = NH * hs, W = C + 2 * KVH * hs, E = 3 * C, N = 301, group = NH / KVH;
    INFO("kv heads " << KVH);
    const std::vector<bf16> in = ToBf16(RandomNormal(N * W, static_cast<uint64_t>(60 + KVH)));
    std::vector<bf16> want(N * E);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) want[n * E + c] = in[n * W + c];
      for (int64_t h = 0; h < NH; ++h) {
        for (int64_t d = 0; d < hs; ++d) {
          want[n * E + C + h * hs + d] = in[n * W + C + (h / group) * hs + d];
          want[n * E + 2 * C + h * hs + d] = in[n * W + C + KVH * hs + (h / group) * hs + d];
        }
      }
    }
    Stream stream;
    DeviceArray<bf16> d_in(in), d_out(std::vector<bf16>(N * E, HostBf16(-7.0f)));
    REQUIRE_OK(ExpandKvHeads(d_out.get(), d_in.get(), N, C, NH, KVH, stream.get()));
    const std::vector<bf16> got = d_out.Download();
    int64_t wrong = 0;
    for (int64_t k = 0; k < N * E; ++k) wrong += Bits(got[k]) != Bits(want[k]);
    CHECK(wrong == 0);

    // Gradients of the expanded rows summed per kv head, in fp32 in query
    // head order, rounded once (the kernel's order: bit for bit).
    const std::vector<bf16> dexp = ToBf16(RandomNormal(N * E, static_cast<uint64_t>(70 + KVH)));
    std::vector<bf16> dwant(N * W);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) dwant[n * W + c] = dexp[n * E + c];
      for (int64_t kv = 0; kv < KVH; ++kv) {
        for (int64_t d = 0; d < hs; ++d) {
          float k_sum = 0.0f, v_sum = 0.0f;
          for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
            k_sum += HostF32(dexp[n * E + C + h * hs + d]);
            v_sum += HostF32(dexp[n * E + 2 * C + h * hs + d]);
          }
          dwant[n * W + C + kv * hs + d] = HostBf16(k_sum);
          dwant[n * W + C + KVH * hs + kv * hs + d] = HostBf16(v_sum);
        }
      }
    }
    DeviceArray<bf16> d_dexp(dexp), d_dqkv(std::vector<bf16>(N * W, HostBf16(-7.0f)));
    REQUIRE_OK(ReduceKvHeads(d_dqkv.get(), d_dexp.get(), N, C, NH, KVH, stream.get()));
    const std::vector<bf16> dgot = d_dqkv.Download();
    wrong = 0;
    for (int64_t k = 0; k < N * W; ++k) wrong += Bits(dgot[k]) != Bits(dwant[k]);
    CHECK(wrong == 0);
  }
}

// These return before touching the device, so they run without a GPU.
TEST_CASE("qkv launchers reject bad sizes and accept empty work") {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  CHECK(RotaryApply(nullptr, nullptr, 4, 192, 3, 63, 1e4, false, nullptr).code() == kInvalid);  // odd head size
  CHECK(RotaryApply(nullptr, nullptr, 4, 100, 3, 64, 1e4, false, nullptr).code() == kInvalid);  // stride < heads
  CHECK(RotaryApply(nullptr, nullptr, 4, 192, 3, 64, 0.0, false, nullptr).code() == kInvalid);  // base
  CHECK(RotaryApply(nullptr, nullptr, 4, 192, 3, 64, 1e4, false, nullptr).code() == kInvalid);  // null
  CHECK(RotaryApply(nullptr, nullptr, 0, 192, 3, 64, 1e4, false, nullptr).ok());
  CHECK(ExpandKvHeads(nullptr, nullptr, 4, 256, 4, 3, nullptr).code() == kInvalid);  // 3 does not divide 4
  CHECK(ExpandKvHeads(nullptr, nullptr, 4, 250, 4, 2, nullptr).code() == kInvalid);  // 4 does not divide 250
  CHECK(ExpandKvHeads(nullptr, nullptr, 4, 256, 4, 2, nullptr).code() == kInvalid);  // null
  CHECK(ExpandKvHeads(nullptr, nullptr, 0, 256, 4, 2, nullptr).ok());
  CHECK(ReduceKvHeads(nullptr, nullptr, -1, 256, 4, 2, nullptr).code() == kInvalid);
  CHECK(ReduceKvHeads(nullptr, nullptr, 0, 256, 4, 2, nullptr).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
