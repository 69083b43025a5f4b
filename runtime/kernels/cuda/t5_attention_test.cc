// T5's CUDA attention against the CPU backend's (fp32, the same bf16-rounded
// inputs): encoder self-attention (bidirectional, relative bias), decoder
// self-attention (causal, bias), cross-attention, over padded and packed
// rows, each head size; outputs, every input gradient and the bias table's
// gradient. Device cases are tagged [gpu].

#include "runtime/kernels/cuda/t5_attention.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cuda/attention_ranges.h"
#include "runtime/kernels/cuda/test_util.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::bf16;
using testing::DeviceArray;
using testing::RandomNormal;
using testing::RelativeError;
using testing::RoundBf16;

constexpr int kBuckets = 32, kMaxDistance = 128;

// dst starts from random values about half the size of `ref`'s, so += is
// tested; returns them.
std::vector<float> InitLike(const std::vector<float>& ref, uint64_t seed) {
  double rms = 0;
  for (float x : ref) rms += static_cast<double>(x) * x;
  rms = std::sqrt(rms / std::max<size_t>(ref.size(), 1));
  std::vector<float> init = RandomNormal(ref.size(), seed);
  for (float& x : init) x *= static_cast<float>(0.5 * rms + 1e-3);
  return RoundBf16(init);
}

std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

struct SelfCase {
  const char* name;
  int64_t T, NH, hs;
  std::vector<std::vector<int64_t>> rows;
  bool causal;
  bool whole_rows;
  uint64_t seed;
};

void CheckSelf(const SelfCase& c) {
  INFO(c.name);
  const int64_t B = static_cast<int64_t>(c.rows.size()), T = c.T, NH = c.NH, C = NH * c.hs;
  const std::vector<int32_t> seg = testing::PackedSegments(T, c.rows);
  const std::vector<float> qkv = RoundBf16(RandomNormal(B * T * 3 * C, c.seed, 0.5f));
  const std::vector<float> dout = RoundBf16(RandomNormal(B * T * C, c.seed + 1));
  const std::vector<float> bias = RoundBf16(RandomNormal(kBuckets * NH, c.seed + 2));
  cpu::AttentionOptions<float> opt;
  opt.causal = c.causal;
  opt.scaled = false;
  opt.bias = bias.data();
  opt.buckets = kBuckets;
  opt.max_distance = kMaxDistance;
  std::vector<float> ref_out(B * T * C), ref_dqkv(B * T * 3 * C, 0.0f), ref_dbias(kBuckets * NH, 0.0f);
  std::vector<float> att(cpu::AttentionProbsSize(seg.data(), B, T, NH));
  cpu::AttentionForward<float>(ref_out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH,
                               cpu::AttentionKernel::kVarlen, opt);
  cpu::AttentionBackward<float>(ref_dqkv.data(), dout.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH,
                                cpu::AttentionKernel::kVarlen, opt, ref_dbias.data());

  const AttentionRanges ranges = MakeAttentionRanges(seg.data(), seg.data(), B, T, T, c.causal, c.whole_rows);
  const std::vector<int32_t> buckets = RelativeBucketTable(T, T, !c.causal, kBuckets, kMaxDistance);
  const std::vector<float> init = InitLike(ref_dqkv, c.seed + 3);
  testing::Stream stream;
  auto d_qkv = testing::UploadBf16(qkv);
  auto d_dout = testing::UploadBf16(dout);
  auto d_bias = testing::UploadBf16(bias);
  auto d_out = testing::UploadBf16(RandomNormal(B * T * C, c.seed + 4));  // garbage to overwrite
  auto d_dqkv = testing::UploadBf16(init);
  DeviceArray<int32_t> d_seg(seg), d_keys(ranges.keys), d_queries(ranges.queries), d_buckets(buckets);
  DeviceArray<float> d_lse(B * T * NH), d_scratch(B * T * NH), d_dbias(kBuckets * NH);
  d_dbias.Zero();
  T5AttentionArgs a;
  a.q = d_qkv.get();
  a.k = d_qkv.get() + C;
  a.v = d_qkv.get() + 2 * C;
  a.ldq = a.ldkv = 3 * C;
  a.seg_q = a.seg_k = d_seg.get();
  a.key_ranges = d_keys.get();
  a.query_ranges = d_queries.get();
  a.B = B;
  a.Tq = a.Tk = T;
  a.C = C;
  a.NH = NH;
  a.causal = c.causal;
  a.bias = d_bias.get();
  a.bucket_of = d_buckets.get();
  a.buckets = kBuckets;
  REQUIRE_OK(T5AttentionForward(a, d_out.get(), d_lse.get(), stream.get()));
  REQUIRE_OK(T5AttentionBackward(a, d_out.get(), d_lse.get(), d_dout.get(), d_dqkv.get(), d_dqkv.get() + C,
                                 d_dqkv.get() + 2 * C, d_dbias.get(), d_scratch.get(), stream.get()));
  stream.Sync();
  const std::vector<float> out = testing::DownloadBf16(d_out);
  const std::vector<float> dqkv = Minus(testing::DownloadBf16(d_dqkv), init);
  CHECK(RelativeError(out, ref_out) <= 1e-2);
  for (int part = 0; part < 3; ++part) {
    INFO("d" << "qkv"[part]);
    std::vector<float> got, want;
    for (int64_t n = 0; n < B * T; ++n) {
      for (int64_t k = 0; k < C; ++k) {
        got.push_back(dqkv[n * 3 * C + part * C + k]);
        want.push_back(ref_dqkv[n * 3 * C + part * C + k]);
      }
    }
    CHECK(RelativeError(got, want) <= 2e-2);
  }
  CHECK(RelativeError(d_dbias.Download(), ref_dbias) <= 1e-2);
  int64_t pad_nonzero = 0;
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t k = 0; k < C && seg[n] < 0; ++k) pad_nonzero += out[n * C + k] != 0.0f;
  }
  CHECK(pad_nonzero == 0);
}

TEST_CASE("T5 encoder self-attention matches the CPU (bidirectional, bias, padded and packed)", "[gpu]") {
  CheckSelf({"encoder hs64", 150, 2, 64, {{150}, {40, 77, 3}, {1}, {}}, false, false, 11});
  CheckSelf({"encoder hs64, whole rows", 150, 2, 64, {{150}, {40, 77, 3}, {1}, {}}, false, true, 11});
  CheckSelf({"encoder hs128", 90, 1, 128, {{31, 33, 26}, {90}}, false, false, 12});
}

TEST_CASE("T5 decoder self-attention matches the CPU (causal, bias)", "[gpu]") {
  CheckSelf({"decoder hs32", 200, 4, 32, {{200}, {64, 65, 1, 70}, {13}}, true, false, 21});
  CheckSelf({"decoder hs32, whole rows", 200, 4, 32, {{200}, {64, 65, 1, 70}, {13}}, true, true, 21});
}

TEST_CASE("T5 cross-attention matches the CPU (targets against their own inputs)", "[gpu]") {
  const int64_t B = 3, Tq = 70, Tk = 120, NH = 2, hs = 64, C = NH * hs;
  const std::vector<int32_t> seg_q = testing::PackedSegments(Tq, {{20, 30, 5}, {70}, {1}});
  const std::vector<int32_t> seg_k = testing::PackedSegments(Tk, {{50, 10, 60}, {33}, {120}});
  const std::vector<float> q = RoundBf16(RandomNormal(B * Tq * C, 31, 0.5f));
  const std::vector<float> kv = RoundBf16(RandomNormal(B * Tk * 2 * C, 32, 0.5f));
  const std::vector<float> dout = RoundBf16(RandomNormal(B * Tq * C, 33));
  std::vector<float> ref_out(B * Tq * C), ref_dq(B * Tq * C, 0.0f), ref_dkv(B * Tk * 2 * C, 0.0f);
  std::vector<float> att(cpu::CrossAttentionProbsSize(seg_q.data(), seg_k.data(), B, Tq, Tk, NH));
  cpu::CrossAttentionForward<float>(ref_out.data(), att.data(), q.data(), kv.data(), seg_q.data(), seg_k.data(), B,
                                    Tq, Tk, C, NH, false);
  cpu::CrossAttentionBackward<float>(ref_dq.data(), ref_dkv.data(), dout.data(), q.data(), kv.data(), att.data(),
                                     seg_q.data(), seg_k.data(), B, Tq, Tk, C, NH, false);

  const AttentionRanges ranges = MakeAttentionRanges(seg_q.data(), seg_k.data(), B, Tq, Tk, false, false);
  const std::vector<float> init_q = InitLike(ref_dq, 34), init_kv = InitLike(ref_dkv, 35);
  testing::Stream stream;
  auto d_q = testing::UploadBf16(q);
  auto d_kv = testing::UploadBf16(kv);
  auto d_dout = testing::UploadBf16(dout);
  auto d_out = testing::UploadBf16(RandomNormal(B * Tq * C, 36));
  auto d_dq = testing::UploadBf16(init_q);
  auto d_dkv = testing::UploadBf16(init_kv);
  DeviceArray<int32_t> d_sq(seg_q), d_sk(seg_k), d_keys(ranges.keys), d_queries(ranges.queries);
  DeviceArray<float> d_lse(B * Tq * NH), d_scratch(B * Tq * NH);
  T5AttentionArgs a;
  a.q = d_q.get();
  a.ldq = C;
  a.k = d_kv.get();
  a.v = d_kv.get() + C;
  a.ldkv = 2 * C;
  a.seg_q = d_sq.get();
  a.seg_k = d_sk.get();
  a.key_ranges = d_keys.get();
  a.query_ranges = d_queries.get();
  a.B = B;
  a.Tq = Tq;
  a.Tk = Tk;
  a.C = C;
  a.NH = NH;
  REQUIRE_OK(T5AttentionForward(a, d_out.get(), d_lse.get(), stream.get()));
  REQUIRE_OK(T5AttentionBackward(a, d_out.get(), d_lse.get(), d_dout.get(), d_dq.get(), d_dkv.get(),
                                 d_dkv.get() + C, nullptr, d_scratch.get(), stream.get()));
  stream.Sync();
  CHECK(RelativeError(testing::DownloadBf16(d_out), ref_out) <= 1e-2);
  CHECK(RelativeError(Minus(testing::DownloadBf16(d_dq), init_q), ref_dq) <= 2e-2);
  CHECK(RelativeError(Minus(testing::DownloadBf16(d_dkv), init_kv), ref_dkv) <= 2e-2);
}

TEST_CASE("T5 attention launchers refuse bad arguments before touching the device") {
  alignas(16) static unsigned char buf[256];
  auto* b16 = reinterpret_cast<bf16*>(buf);
  auto* i32 = reinterpret_cast<int32_t*>(buf);
  auto* f32 = reinterpret_cast<float*>(buf);
  T5AttentionArgs a;
  a.q = a.k = a.v = b16;
  a.ldq = a.ldkv = 96;
  a.seg_q = a.seg_k = a.key_ranges = a.query_ranges = i32;
  a.B = 1;
  a.Tq = a.Tk = 4;
  a.C = 96;
  a.NH = 2;  // head size 48
  auto says = [](const absl::Status& s, const std::string& what) {
    return s.code() == absl::StatusCode::kInvalidArgument && std::string(s.message()).find(what) != std::string::npos;
  };
  CHECK(says(T5AttentionForward(a, b16, f32, nullptr), "head size 48"));
  a.C = 128;
  a.ldq = a.ldkv = 384;
  a.Tk = 5;
  a.causal = true;
  CHECK(says(T5AttentionForward(a, b16, f32, nullptr), "causal"));
  a.causal = false;
  a.k = b16 + 1;
  CHECK(says(T5AttentionForward(a, b16, f32, nullptr), "aligned"));
  a.k = b16;
  a.bias = b16;
  CHECK(says(T5AttentionForward(a, b16, f32, nullptr), "bucket"));
  a.bias = nullptr;
  CHECK(says(T5AttentionBackward(a, b16, f32, b16, b16, b16, b16, f32, f32, nullptr), "bias gradient"));
  CHECK(says(T5AttentionBackward(a, b16, f32, b16, b16, b16, b16, nullptr, nullptr, nullptr), "null"));
  a.B = 0;  // no work: nothing launched
  CHECK(T5AttentionForward(a, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
