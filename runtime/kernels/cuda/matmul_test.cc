#include "runtime/kernels/cuda/matmul.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cuda/test_util.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::bf16;
using testing::DeviceArray;
using testing::DownloadBf16;
using testing::RandomNormal;
using testing::RelativeError;
using testing::RoundBf16;
using testing::Stream;
using testing::UploadBf16;

struct Shape {
  int64_t N, C, OC;
};

std::string Describe(const Shape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC);
}

std::unique_ptr<Matmul> NewMatmul(size_t workspace_bytes = 32 << 20) {
  auto mm = Matmul::Create(workspace_bytes);
  INFO(mm.status().ToString());
  REQUIRE(mm.ok());
  return std::move(*mm);
}

// Inputs of one layer, bf16-rounded so the CPU sees the device's values. The
// weight scale keeps outputs O(1) so the accumulate checks are sensitive.
struct Layer {
  Layer(const Shape& s, uint64_t seed)
      : inp(RoundBf16(RandomNormal(s.N * s.C, seed))),
        weight(RoundBf16(RandomNormal(s.OC * s.C, seed + 1, 1.0f / std::sqrt(static_cast<float>(s.C))))),
        bias(RoundBf16(RandomNormal(s.OC, seed + 2))),
        dout(RoundBf16(RandomNormal(s.N * s.OC, seed + 3))) {}
  std::vector<float> inp, weight, bias, dout;
};

// Forward on the device vs cpu::MatmulForward; `out` starts as garbage.
void CheckForward(Matmul& mm, const Shape& s, bool with_bias, uint64_t seed) {
  INFO(Describe(s) << " bias=" << with_bias);
  const Layer l(s, seed);
  std::vector<float> want(s.N * s.OC);
  cpu::MatmulForward(want.data(), l.inp.data(), l.weight.data(), with_bias ? l.bias.data() : nullptr, s.N, s.C,
                     s.OC);
  DeviceArray<bf16> inp = UploadBf16(l.inp), weight = UploadBf16(l.weight), bias = UploadBf16(l.bias);
  DeviceArray<bf16> out = UploadBf16(RandomNormal(s.N * s.OC, seed + 9, 100.0f));
  Stream stream;
  REQUIRE_OK(mm.Forward(out.get(), inp.get(), weight.get(), with_bias ? bias.get() : nullptr, s.N, s.C, s.OC,
                        stream.get()));
  stream.Sync();
  CHECK(RelativeError(DownloadBf16(out), want) <= 1e-2);
}

// Backward on the device vs cpu::MatmulBackward; every destination starts
// from random values (accumulation).
void CheckBackward(Matmul& mm, const Shape& s, bool with_dinp, bool with_dbias, uint64_t seed) {
  INFO(Describe(s) << " dinp=" << with_dinp << " dbias=" << with_dbias);
  const Layer l(s, seed);
  const std::vector<float> dinp0 = RoundBf16(RandomNormal(s.N * s.C, seed + 4));
  const std::vector<float> dweight0 = RandomNormal(s.OC * s.C, seed + 5);
  const std::vector<float> dbias0 = RandomNormal(s.OC, seed + 6);
  std::vector<float> want_dinp = dinp0, want_dweight = dweight0, want_dbias = dbias0;
  cpu::MatmulBackward(with_dinp ? want_dinp.data() : nullptr, want_dweight.data(),
                      with_dbias ? want_dbias.data() : nullptr, l.dout.data(), l.inp.data(), l.weight.data(), s.N,
                      s.C, s.OC);

  DeviceArray<bf16> inp = UploadBf16(l.inp), weight = UploadBf16(l.weight), dout = UploadBf16(l.dout);
  DeviceArray<bf16> dinp = UploadBf16(dinp0);
  DeviceArray<float> dweight(dweight0), dbias(dbias0);
  Stream stream;
  REQUIRE_OK(mm.Backward(with_dinp ? dinp.get() : nullptr, dweight.get(), with_dbias ? dbias.get() : nullptr,
                         dout.get(), inp.get(), weight.get(), s.N, s.C, s.OC, stream.get()));
  stream.Sync();
  CHECK(RelativeError(DownloadBf16(dinp), want_dinp) <= 1e-2);  // untouched (== dinp0) when null
  CHECK(RelativeError(dweight.Download(), want_dweight) <= 1e-4);
  CHECK(RelativeError(dbias.Download(), want_dbias) <= 1e-4);  // untouched when null
}

// Odd sizes (N = 1, C and OC not multiples of 8 or 32), a GPT-2 MLP shape,
// and enough rows for the multi-slice bias gradient.
const std::vector<Shape> kShapes = {
    {1, 72, 200}, {37, 72, 200}, {37, 33, 17}, {5, 8, 3}, {1000, 40, 200}, {512, 768, 3072}, {300, 3072, 768},
};

TEST_CASE("Matmul::Forward matches cpu::MatmulForward", "[gpu]") {
  auto mm = NewMatmul();
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    CheckForward(*mm, s, /*with_bias=*/true, seed += 10);
    CheckForward(*mm, s, /*with_bias=*/false, seed += 10);
  }
  // Cached plans: the same shapes again give the same answers.
  for (const Shape& s : kShapes) CheckForward(*mm, s, /*with_bias=*/true, seed += 10);
}

TEST_CASE("Matmul::Backward matches cpu::MatmulBackward and accumulates", "[gpu]") {
  auto mm = NewMatmul();
  uint64_t seed = 1000;
  for (const Shape& s : kShapes) {
    CheckBackward(*mm, s, /*with_dinp=*/true, /*with_dbias=*/true, seed += 10);
    CheckBackward(*mm, s, /*with_dinp=*/false, /*with_dbias=*/true, seed += 10);
    CheckBackward(*mm, s, /*with_dinp=*/true, /*with_dbias=*/false, seed += 10);
  }
}

TEST_CASE("Matmul without workspace sums the bias gradient in one pass", "[gpu]") {
  auto mm = NewMatmul(/*workspace_bytes=*/0);
  CheckForward(*mm, {1000, 40, 200}, true, 7);
  CheckBackward(*mm, {1000, 40, 200}, true, true, 8);
  CheckBackward(*mm, {4096, 64, 24}, true, true, 9);
}

TEST_CASE("Matmul::Forward bias of different alignments reuses the shape's plan safely", "[gpu]") {
  // A bias at a 16-byte (not 256-byte) aligned address after one at a
  // 256-byte aligned address: the heuristic infers bias alignment from the
  // pointer, so the two must not share a cached algorithm blindly.
  const Shape s{64, 128, 96};
  auto mm = NewMatmul();
  const Layer l(s, 77);
  std::vector<float> padded_bias(8, 0.0f);  // 8 bf16 = 16 bytes of offset
  padded_bias.insert(padded_bias.end(), l.bias.begin(), l.bias.end());
  DeviceArray<bf16> inp = UploadBf16(l.inp), weight = UploadBf16(l.weight), bias = UploadBf16(l.bias);
  DeviceArray<bf16> bias16 = UploadBf16(padded_bias);
  DeviceArray<bf16> out(s.N * s.OC), out16(s.N * s.OC);
  std::vector<float> want(s.N * s.OC);
  cpu::MatmulForward(want.data(), l.inp.data(), l.weight.data(), l.bias.data(), s.N, s.C, s.OC);
  Stream stream;
  REQUIRE_OK(mm->Forward(out.get(), inp.get(), weight.get(), bias.get(), s.N, s.C, s.OC, stream.get()));
  REQUIRE_OK(mm->Forward(out16.get(), inp.get(), weight.get(), bias16.get() + 8, s.N, s.C, s.OC, stream.get()));
  stream.Sync();
  CHECK(RelativeError(DownloadBf16(out), want) <= 1e-2);
  CHECK(RelativeError(DownloadBf16(out16), want) <= 1e-2);
}

TEST_CASE("Matmul is movable and checks its arguments", "[gpu]") {
  auto created = NewMatmul();
  Matmul mm = std::move(*created);
  const Shape s{4, 16, 8};
  DeviceArray<bf16> inp(s.N * s.C + 8), weight(s.OC * s.C), out(s.N * s.OC);
  DeviceArray<float> dweight(s.OC * s.C);
  Stream stream;
  const cudaStream_t st = stream.get();
  CHECK(created->Forward(out.get(), inp.get(), weight.get(), nullptr, s.N, s.C, s.OC, st).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(mm.Forward(out.get(), inp.get() + 1, weight.get(), nullptr, s.N, s.C, s.OC, st).code() ==
        absl::StatusCode::kInvalidArgument);  // 2-byte aligned
  CHECK(mm.Forward(out.get(), inp.get(), weight.get(), nullptr, s.N, 0, s.OC, st).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mm.Forward(out.get(), inp.get(), weight.get(), nullptr, s.N, s.C, -1, st).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mm.Forward(out.get(), inp.get(), weight.get(), nullptr, -1, s.C, s.OC, st).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mm.Forward(nullptr, inp.get(), weight.get(), nullptr, s.N, s.C, s.OC, st).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mm.Backward(nullptr, nullptr, nullptr, out.get(), inp.get(), weight.get(), s.N, s.C, s.OC, st).code() ==
        absl::StatusCode::kInvalidArgument);  // dweight is required
  // No rows: nothing to do, pointers unused.
  CHECK(mm.Forward(nullptr, nullptr, nullptr, nullptr, 0, s.C, s.OC, st).ok());
  CHECK(mm.Backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, s.C, s.OC, st).ok());
  // The moved-to instance still works.
  CheckForward(mm, s, true, 5);
}

std::unique_ptr<Matmul> NewMatmul(bool epilogues) {
  auto mm = Matmul::Create(Matmul::Options{size_t{32} << 20, epilogues, nullptr});
  INFO(mm.status().ToString());
  REQUIRE(mm.ok());
  return std::move(*mm);
}

// The fused operations of the GPT layer against the CPU's separate steps:
// out = gelu(inp W^T + b) with its input kept; out = inp W^T + b + residual;
// dpre = gelu'(pre) * (dout W) with dW, db accumulated. `fused_calls`: how
// many of the three products ran with an epilogue (a fallback is correct too,
// but on sm_80 / sm_90 all should fuse).
void CheckFusedLayer(Matmul& mm, const Shape& s, uint64_t seed, int64_t* fused_calls) {
  INFO(Describe(s));
  const Layer l(s, seed);
  Stream stream;
  const Matmul::EpilogueCounts before = mm.epilogue_counts();
  // Forward with GELU.
  std::vector<float> want_pre(s.N * s.OC), want_out(s.N * s.OC);
  cpu::MatmulForward(want_pre.data(), l.inp.data(), l.weight.data(), l.bias.data(), s.N, s.C, s.OC);
  const std::vector<float> pre_rounded = RoundBf16(want_pre);
  cpu::GeluForward(want_out.data(), pre_rounded.data(), s.N * s.OC);
  DeviceArray<bf16> inp = UploadBf16(l.inp), weight = UploadBf16(l.weight), bias = UploadBf16(l.bias);
  DeviceArray<bf16> out = UploadBf16(RandomNormal(s.N * s.OC, seed + 9, 100.0f));
  DeviceArray<bf16> pre = UploadBf16(RandomNormal(s.N * s.OC, seed + 10, 100.0f));
  REQUIRE_OK(mm.ForwardGelu(out.get(), pre.get(), inp.get(), weight.get(), bias.get(), s.N, s.C, s.OC, stream.get()));
  // Forward with the residual, in place too.
  const std::vector<float> residual = RoundBf16(RandomNormal(s.N * s.OC, seed + 11));
  std::vector<float> want_res(s.N * s.OC);
  cpu::MatmulForward(want_res.data(), l.inp.data(), l.weight.data(), l.bias.data(), s.N, s.C, s.OC);
  for (size_t i = 0; i < want_res.size(); ++i) want_res[i] += residual[i];
  DeviceArray<bf16> res = UploadBf16(residual), res_out(s.N * s.OC), in_place = UploadBf16(residual);
  REQUIRE_OK(mm.ForwardResidual(res_out.get(), inp.get(), weight.get(), bias.get(), res.get(), s.N, s.C, s.OC,
                                stream.get()));
  REQUIRE_OK(mm.ForwardResidual(in_place.get(), inp.get(), weight.get(), bias.get(), in_place.get(), s.N, s.C, s.OC,
                                stream.get()));
  // Backward through a GELU feeding this layer: inp = gelu(gpre).
  const std::vector<float> gpre = RoundBf16(RandomNormal(s.N * s.C, seed + 12));
  std::vector<float> ginp(s.N * s.C);
  cpu::GeluForward(ginp.data(), gpre.data(), s.N * s.C);
  ginp = RoundBf16(ginp);
  const std::vector<float> dweight0 = RandomNormal(s.OC * s.C, seed + 5), dbias0 = RandomNormal(s.OC, seed + 6);
  std::vector<float> dx(s.N * s.C, 0.0f), want_dweight = dweight0, want_dbias = dbias0, want_dpre(s.N * s.C, 0.0f);
  cpu::MatmulBackward(dx.data(), want_dweight.data(), want_dbias.data(), l.dout.data(), ginp.data(), l.weight.data(),
                      s.N, s.C, s.OC);
  cpu::GeluBackward(want_dpre.data(), gpre.data(), dx.data(), s.N * s.C);
  DeviceArray<bf16> d_gpre = UploadBf16(gpre), d_ginp = UploadBf16(ginp), dout = UploadBf16(l.dout);
  DeviceArray<bf16> dpre = UploadBf16(RandomNormal(s.N * s.C, seed + 13, 100.0f));  // overwritten
  DeviceArray<float> dweight(dweight0), dbias(dbias0);
  REQUIRE_OK(mm.BackwardThroughGelu(dpre.get(), dweight.get(), dbias.get(), dout.get(), d_ginp.get(), weight.get(),
                                    d_gpre.get(), s.N, s.C, s.OC, stream.get()));
  stream.Sync();
  CHECK(RelativeError(DownloadBf16(pre), want_pre) <= 1e-2);
  CHECK(RelativeError(DownloadBf16(out), want_out) <= 2e-2);
  CHECK(RelativeError(DownloadBf16(res_out), want_res) <= 1e-2);
  CHECK(RelativeError(DownloadBf16(in_place), want_res) <= 1e-2);
  CHECK(RelativeError(DownloadBf16(dpre), want_dpre) <= 2e-2);
  CHECK(RelativeError(dweight.Download(), want_dweight) <= 1e-4);
  CHECK(RelativeError(dbias.Download(), want_dbias) <= 1e-4);
  const Matmul::EpilogueCounts after = mm.epilogue_counts();
  *fused_calls += after.fused - before.fused;
}

// Multiples of 8 (the GELU epilogues' leading dimensions): GPT-2's MLP both
// ways, a small one, and rows not a multiple of anything.
const std::vector<Shape> kFusedShapes = {{37, 72, 200}, {1000, 40, 200}, {512, 768, 3072}, {300, 3072, 768}};

TEST_CASE("Matmul's fused GELU, residual and bias-gradient epilogues match the CPU; they fuse on this device",
          "[gpu]") {
  auto fused = NewMatmul(true);
  int64_t fused_calls = 0;
  uint64_t seed = 3000;
  for (const Shape& s : kFusedShapes) CheckFusedLayer(*fused, s, seed += 20, &fused_calls);
  // Three epilogues per shape: GELU_AUX_BIAS, DGELU, BGRADB.
  CHECK(fused_calls == 3 * static_cast<int64_t>(kFusedShapes.size()));
  CHECK(fused->epilogue_counts().fallback == 0);
}

TEST_CASE("Matmul without epilogues gives the same results through separate kernels", "[gpu]") {
  auto separate = NewMatmul(false);
  int64_t fused_calls = 0;
  uint64_t seed = 4000;
  for (const Shape& s : kFusedShapes) CheckFusedLayer(*separate, s, seed += 20, &fused_calls);
  CHECK(fused_calls == 0);
}

TEST_CASE("Matmul's GELU operations refuse leading dimensions the epilogues cannot take", "[gpu]") {
  auto mm = NewMatmul(true);
  CHECK(mm->ForwardGelu(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 16, 12, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mm->BackwardThroughGelu(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 12, 16, nullptr)
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
