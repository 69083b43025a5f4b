#include "runtime/kernels/cuda/attention.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cuda/test_util.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::bf16;
using testing::DeviceArray;
using testing::RandomNormal;
using testing::RelativeError;
using testing::RoundBf16;

std::vector<int32_t> PackedSeg(int64_t T, const std::vector<std::vector<int64_t>>& rows) {
  return testing::PackedSegments(T, rows);
}

// Random sample lengths in [1, max_len] filling up to `fill` of T tokens.
std::vector<int64_t> RandomLengths(int64_t fill, int64_t max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> len(1, max_len);
  std::vector<int64_t> out;
  int64_t used = 0;
  while (true) {
    const int64_t n = len(rng);
    if (used + n > fill) break;
    out.push_back(n);
    used += n;
  }
  return out;
}

int64_t Tiles(int64_t T) { return (T + kAttentionTile - 1) / kAttentionTile; }

// Tile pairs (kt <= qt) holding at least one (query, key) pair of one sample.
int64_t NeededPairs(const std::vector<int32_t>& seg, int64_t B, int64_t T) {
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t qt = 0; qt < Tiles(T); ++qt) {
      for (int64_t kt = 0; kt <= qt; ++kt) {
        bool needed = false;
        for (int64_t i = qt * kAttentionTile; i < std::min(T, (qt + 1) * kAttentionTile) && !needed; ++i) {
          for (int64_t j = kt * kAttentionTile; j < std::min(T, (kt + 1) * kAttentionTile) && j <= i; ++j) {
            if (seg[b * T + i] >= 0 && seg[b * T + i] == seg[b * T + j]) {
              needed = true;
              break;
            }
          }
        }
        n += needed;
      }
    }
  }
  return n;
}

TEST_CASE("AttentionTileWork: a full row computes the causal triangle in both modes") {
  for (int64_t T : {1, 64, 65, 200, 1000}) {
    const std::vector<int32_t> seg = PackedSeg(T, {{T}});
    const int64_t nt = Tiles(T);
    INFO("T=" << T);
    CHECK(AttentionTileWork(seg.data(), 1, T, AttentionMode::kMaterialized) == nt * (nt + 1) / 2);
    CHECK(AttentionTileWork(seg.data(), 1, T, AttentionMode::kVarlen) == nt * (nt + 1) / 2);
  }
}

TEST_CASE("AttentionTileWork: padded rows compute fewer tiles under varlen") {
  const int64_t T = 1000;  // 16 tiles
  const std::vector<int32_t> seg = PackedSeg(T, {{600}, {1000}, {1}});
  CHECK(AttentionTileWork(seg.data(), 3, T, AttentionMode::kMaterialized) == 3 * 136);
  // 600 tokens span tiles 0..9 (55 pairs), the full row 136, one token 1.
  CHECK(AttentionTileWork(seg.data(), 3, T, AttentionMode::kVarlen) == 55 + 136 + 1);
  CHECK(AttentionTileWork(seg.data(), 3, T, AttentionMode::kVarlen) == NeededPairs(seg, 3, T));
}

TEST_CASE("AttentionTileWork: packed short samples compute far fewer tiles under varlen") {
  const int64_t T = 2048;  // 32 tiles
  const std::vector<int32_t> seg = PackedSeg(T, {std::vector<int64_t>(40, 50), RandomLengths(2000, 120, 3)});
  const int64_t materialized = AttentionTileWork(seg.data(), 2, T, AttentionMode::kMaterialized);
  const int64_t varlen = AttentionTileWork(seg.data(), 2, T, AttentionMode::kVarlen);
  CHECK(materialized == 2 * 32 * 33 / 2);
  CHECK(varlen * 5 < materialized);
  // Contiguous samples: range overlap is exactly "shares a sample".
  CHECK(varlen == NeededPairs(seg, 2, T));
}

TEST_CASE("AttentionTileWork: an all-padding row computes nothing under varlen") {
  const int64_t T = 300;
  const std::vector<int32_t> seg(T, -1);
  CHECK(AttentionTileWork(seg.data(), 1, T, AttentionMode::kVarlen) == 0);
  CHECK(AttentionTileWork(seg.data(), 1, T, AttentionMode::kMaterialized) == Tiles(T) * (Tiles(T) + 1) / 2);
  CHECK(AttentionTileWork(seg.data(), 0, T, AttentionMode::kVarlen) == 0);
}

TEST_CASE("TilePairComputed never skips a visible pair, even for scattered segments") {
  const int64_t T = 640;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> id(-1, 4);
  std::vector<int32_t> seg(T);
  for (auto& s : seg) s = id(rng);
  std::vector<TileSegRange> ranges(Tiles(T), EmptyTileSegRange());
  for (int64_t t = 0; t < T; ++t) ranges[t / kAttentionTile] = ExtendTileSegRange(ranges[t / kAttentionTile], seg[t]);
  int64_t missed = 0;
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      if (seg[i] < 0 || seg[i] != seg[j]) continue;
      const int64_t qt = i / kAttentionTile, kt = j / kAttentionTile;
      missed += !TilePairComputed(true, qt, kt, ranges[qt], ranges[kt]);
    }
  }
  CHECK(missed == 0);
  CHECK(NeededPairs(seg, 1, T) <= AttentionTileWork(seg.data(), 1, T, AttentionMode::kVarlen));
}

TEST_CASE("Attention launchers reject bad shapes and pointers before touching the device") {
  alignas(16) static unsigned char buf[64];
  auto* b16 = reinterpret_cast<bf16*>(buf);
  auto* f32 = reinterpret_cast<float*>(buf);
  auto* i32 = reinterpret_cast<int32_t*>(buf);
  const auto mode = AttentionMode::kVarlen;
  const absl::Status bad_hs = AttentionForward(b16, f32, b16, i32, 1, 8, 96, 2, mode, nullptr);  // hs 48
  CHECK(bad_hs.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad_hs.message()).find("hs") != std::string::npos);
  CHECK(AttentionForward(b16, f32, b16, i32, 1, 8, 129, 2, mode, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);  // C % NH
  CHECK(AttentionForward(b16, f32, b16, i32, -1, 8, 128, 2, mode, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(AttentionForward(b16, f32, b16, i32, 1, 65537, 128, 2, mode, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  const absl::Status misaligned =
      AttentionForward(b16, f32, reinterpret_cast<bf16*>(buf + 2), i32, 1, 8, 128, 2, mode, nullptr);
  CHECK(misaligned.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(misaligned.message()).find("qkv") != std::string::npos);
  const absl::Status no_scratch = AttentionBackward(b16, b16, b16, b16, f32, i32, 1, 8, 128, 2, mode, nullptr, nullptr);
  CHECK(no_scratch.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(no_scratch.message()).find("scratch") != std::string::npos);
  CHECK(AttentionBackward(b16, b16, b16, b16, f32, i32, 1, 8, 96, 2, mode, f32, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  // No work: OK without launching (null pointers are fine then).
  CHECK(AttentionForward(nullptr, nullptr, nullptr, nullptr, 0, 8, 128, 2, mode, nullptr).ok());
  CHECK(AttentionBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 2, 0, 128, 2, mode, nullptr, nullptr)
            .ok());
}

// ---------------------------------------------------------------- [gpu]

struct Case {
  const char* name;
  int64_t T, NH, hs;
  std::vector<std::vector<int64_t>> rows;  // sample lengths per row
  uint64_t seed;
};

struct Result {
  std::vector<float> out, lse, dqkv;
};

// logsumexp (B, NH, T) of each real query's scaled visible scores (0 for padding).
std::vector<float> HostLse(const std::vector<float>& qkv, const std::vector<int32_t>& seg, int64_t B, int64_t T,
                           int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const double scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> lse(B * NH * T, 0.0f);
  std::vector<double> s(T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        if (seg[b * T + i] < 0) continue;
        const float* q = &qkv[(b * T + i) * 3 * C + h * hs];
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = -INFINITY;
          if (seg[b * T + j] != seg[b * T + i]) continue;
          const float* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        lse[(b * NH + h) * T + i] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
  return lse;
}

Result RunGpu(const std::vector<float>& qkv, const std::vector<float>& dout, const std::vector<float>& dqkv_init,
              const std::vector<int32_t>& seg, int64_t B, int64_t T, int64_t C, int64_t NH, AttentionMode mode,
              uint64_t seed) {
  testing::Stream stream;
  auto d_qkv = testing::UploadBf16(qkv);
  auto d_dout = testing::UploadBf16(dout);
  auto d_out = testing::UploadBf16(RandomNormal(B * T * C, seed + 7));  // garbage the kernel must overwrite
  auto d_dqkv = testing::UploadBf16(dqkv_init);
  DeviceArray<int32_t> d_seg(seg);
  DeviceArray<float> d_lse(RandomNormal(B * NH * T, seed + 8));
  DeviceArray<float> d_scratch(AttentionBackwardScratchElements(B, T, C, NH));
  REQUIRE(AttentionForward(d_out.get(), d_lse.get(), d_qkv.get(), d_seg.get(), B, T, C, NH, mode, stream.get()).ok());
  REQUIRE(AttentionBackward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), d_seg.get(), B, T, C, NH,
                            mode, d_scratch.get(), stream.get())
              .ok());
  stream.Sync();
  return Result{testing::DownloadBf16(d_out), d_lse.Download(), testing::DownloadBf16(d_dqkv)};
}

int64_t Mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += !(a[i] == b[i]);  // NaN counts
  return n;
}

void CheckCase(const Case& c) {
  const int64_t B = static_cast<int64_t>(c.rows.size()), T = c.T, NH = c.NH, C = c.NH * c.hs;
  const std::vector<int32_t> seg = PackedSeg(T, c.rows);
  const std::vector<float> qkv = RoundBf16(RandomNormal(B * T * 3 * C, c.seed));
  const std::vector<float> dout = RoundBf16(RandomNormal(B * T * C, c.seed + 1));

  // fp32 reference on the same bf16 values.
  std::vector<float> ref_out(B * T * C), att(B * NH * T * T), ref_dqkv(B * T * 3 * C, 0.0f);
  cpu::AttentionForward<float>(ref_out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH);
  cpu::AttentionBackward<float>(ref_dqkv.data(), dout.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH);
  const std::vector<float> ref_lse = HostLse(qkv, seg, B, T, C, NH);

  // dqkv starts from random values about half the size of each part's
  // gradient, so += is tested without bf16 rounding of the sum hiding errors.
  double rms[3] = {0, 0, 0};
  for (int64_t i = 0; i < B * T * 3 * C; ++i) rms[i % (3 * C) / C] += static_cast<double>(ref_dqkv[i]) * ref_dqkv[i];
  for (double& r : rms) r = std::sqrt(r / (B * T * C));
  std::vector<float> init = RandomNormal(B * T * 3 * C, c.seed + 2);
  for (int64_t i = 0; i < B * T * 3 * C; ++i) init[i] *= static_cast<float>(0.5 * rms[i % (3 * C) / C] + 1e-3);
  init = RoundBf16(init);

  Result results[2];
  const AttentionMode modes[2] = {AttentionMode::kVarlen, AttentionMode::kMaterialized};
  for (int m = 0; m < 2; ++m) {
    INFO(c.name << (m == 0 ? ", varlen" : ", materialized"));
    const Result r = RunGpu(qkv, dout, init, seg, B, T, C, NH, modes[m], c.seed);
    CHECK(RelativeError(r.out, ref_out) <= 1e-2);

    std::vector<float> got_lse, want_lse;
    int64_t pad_out_nonzero = 0, pad_lse_nonzero = 0, pad_dqkv_changed = 0;
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      if (seg[bt] >= 0) {
        for (int64_t h = 0; h < NH; ++h) {
          got_lse.push_back(r.lse[(b * NH + h) * T + t]);
          want_lse.push_back(ref_lse[(b * NH + h) * T + t]);
        }
        continue;
      }
      for (int64_t k = 0; k < C; ++k) pad_out_nonzero += r.out[bt * C + k] != 0.0f;
      for (int64_t h = 0; h < NH; ++h) pad_lse_nonzero += r.lse[(b * NH + h) * T + t] != 0.0f;
      for (int64_t k = 0; k < 3 * C; ++k) pad_dqkv_changed += r.dqkv[bt * 3 * C + k] != init[bt * 3 * C + k];
    }
    CHECK(RelativeError(got_lse, want_lse) <= 1e-4);
    CHECK(pad_out_nonzero == 0);
    CHECK(pad_lse_nonzero == 0);
    CHECK(pad_dqkv_changed == 0);

    for (int part = 0; part < 3; ++part) {
      INFO("d"
           << "qkv"[part]);
      std::vector<float> got, want;
      for (int64_t bt = 0; bt < B * T; ++bt) {
        for (int64_t k = 0; k < C; ++k) {
          const int64_t i = bt * 3 * C + part * C + k;
          got.push_back(r.dqkv[i] - init[i]);
          want.push_back(ref_dqkv[i]);
        }
      }
      double want_norm = 0, got_max = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        want_norm += static_cast<double>(want[i]) * want[i];
        got_max = std::max(got_max, static_cast<double>(std::fabs(got[i])));
      }
      if (want_norm > 0) {
        CHECK(RelativeError(got, want) <= 1e-2);
      } else {  // e.g. dq, dk of one-token samples: softmax over one key has no gradient
        CHECK(got_max <= 1e-3);
      }
    }
    results[m] = r;
  }

  // Masked pairs add exact zeros: both modes give the same values.
  INFO(c.name << ": varlen vs materialized");
  CHECK(Mismatches(results[0].out, results[1].out) == 0);
  CHECK(Mismatches(results[0].dqkv, results[1].dqkv) == 0);
  int64_t lse_mismatches = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t i = (b * NH + h) * T + t;
        lse_mismatches += seg[b * T + t] >= 0 && results[0].lse[i] != results[1].lse[i];
      }
    }
  }
  CHECK(lse_mismatches == 0);
}

TEST_CASE("Attention matches the CPU on a padded batch (hs 64, T not a tile multiple, all-padding row)", "[gpu]") {
  CheckCase({"padded hs64", 200, 2, 64, {{200}, {137}, {64}, {}}, 101});
}

TEST_CASE("Attention matches the CPU on a packed batch (hs 128)", "[gpu]") {
  CheckCase({"packed hs128", 333, 2, 128, {{50, 17, 100, 90, 60}, {1, 63, 65, 130, 74}}, 202});
}

TEST_CASE("Attention matches the CPU with hs 32 and mixed rows", "[gpu]") {
  CheckCase({"mixed hs32", 97, 3, 32, {{97}, {30, 3, 40}, {1}}, 303});
}

TEST_CASE("Attention matches the CPU on a single token", "[gpu]") { CheckCase({"single token", 1, 1, 64, {{1}}, 404}); }

TEST_CASE("Attention matches the CPU on many short packed samples", "[gpu]") {
  CheckCase({"many short hs64", 700, 1, 64, {RandomLengths(680, 40, 5)}, 505});
  CheckCase({"many short hs128", 300, 2, 128, {RandomLengths(300, 20, 6), RandomLengths(250, 70, 7)}, 606});
}

TEST_CASE("Attention modes agree on long packed rows", "[gpu]") {
  // Too long for the CPU reference: both modes must agree, outputs be finite
  // and padding zero.
  const int64_t B = 2, T = 4100, NH = 2, C = 2 * 128;
  const std::vector<int32_t> seg = PackedSeg(T, {RandomLengths(4000, 900, 8), RandomLengths(4100, 300, 9)});
  const std::vector<float> qkv = RoundBf16(RandomNormal(B * T * 3 * C, 707));
  const std::vector<float> dout = RoundBf16(RandomNormal(B * T * C, 708));
  const std::vector<float> init = RoundBf16(RandomNormal(B * T * 3 * C, 709, 0.1f));
  const Result varlen = RunGpu(qkv, dout, init, seg, B, T, C, NH, AttentionMode::kVarlen, 710);
  const Result materialized = RunGpu(qkv, dout, init, seg, B, T, C, NH, AttentionMode::kMaterialized, 710);
  CHECK(Mismatches(varlen.out, materialized.out) == 0);
  CHECK(Mismatches(varlen.dqkv, materialized.dqkv) == 0);
  int64_t bad = 0;
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t k = 0; k < C; ++k) {
      const float o = varlen.out[bt * C + k];
      bad += !std::isfinite(o) || (seg[bt] < 0 && o != 0.0f);
    }
  }
  CHECK(bad == 0);
  CHECK(AttentionTileWork(seg.data(), B, T, AttentionMode::kVarlen) * 3 <
        AttentionTileWork(seg.data(), B, T, AttentionMode::kMaterialized));
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
