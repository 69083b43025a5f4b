// The layer kernels (embedding, LayerNorm, RMS norm, GELU, ReLU, gated GELU,
// SwiGLU, softmax cross-entropy)
// against the CPU backend run on the same bf16-rounded inputs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/kernels/cpu/ops.h"
#include "runtime/kernels/cuda/cross_entropy.h"
#include "runtime/kernels/cuda/embedding.h"
#include "runtime/kernels/cuda/gelu.h"
#include "runtime/kernels/cuda/layernorm.h"
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

// bf16-rounded N(mean, std) values.
std::vector<float> RandomBf16(size_t n, uint64_t seed, float std = 1.0f, float mean = 0.0f) {
  std::vector<float> v = RandomNormal(n, seed, std);
  for (float& x : v) x += mean;
  return RoundBf16(v);
}

std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// max_i |got_i - want_i| / max(|want_i|, 1): per-element check for statistics
// whose magnitudes differ across rows (a norm-wise error would hide the small
// ones behind the rows with a large mean).
double MaxScaledError(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, d / std::max(1.0, std::fabs(static_cast<double>(want[i]))));
  }
  return worst;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// ---------------------------------------------------------------- embedding

TEST_CASE("Embedding without positions copies token rows and adds only into dwte", "[gpu]") {
  const int64_t N = 200, V = 40, C = 96;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 13) % V);
  const std::vector<float> wte = RandomBf16(V * C, 21);
  Stream stream;
  DeviceArray<int32_t> d_tokens(tokens);
  auto d_wte = UploadBf16(wte);
  DeviceArray<bf16> d_out(N * C);
  REQUIRE(EmbeddingForward(d_out.get(), d_tokens.get(), nullptr, d_wte.get(), nullptr, N, C, stream.get()).ok());
  const std::vector<float> out = DownloadBf16(d_out);
  int64_t wrong = 0;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t c = 0; c < C; ++c) wrong += out[i * C + c] != wte[tokens[i] * C + c];
  }
  CHECK(wrong == 0);
  const std::vector<float> dout = RandomBf16(N * C, 22);
  std::vector<float> want(V * C, 0.0f);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t c = 0; c < C; ++c) want[tokens[i] * C + c] += dout[i * C + c];
  }
  DeviceArray<float> d_dwte(std::vector<float>(V * C, 0.0f));
  auto d_dout = UploadBf16(dout);
  REQUIRE(EmbeddingBackward(d_dwte.get(), nullptr, d_dout.get(), d_tokens.get(), nullptr, N, C, stream.get()).ok());
  CHECK(RelativeError(d_dwte.Download(), want) <= 1e-5);
  // Positions without a table (or the reverse) are refused.
  CHECK(EmbeddingForward(d_out.get(), d_tokens.get(), d_tokens.get(), d_wte.get(), nullptr, N, C, stream.get())
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("EmbeddingForward/Backward match the CPU backend with repeated tokens and positions", "[gpu]") {
  for (const int64_t C : {768, 37}) {
    INFO("C=" << C);
    const int64_t N = 300, V = 80, P = 64, kUsedTokens = 50;
    std::mt19937 rng(11);
    std::vector<int32_t> tokens(N), positions(N);
    for (int64_t i = 0; i < N; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % kUsedTokens);  // ~6 rows per token: collisions
      positions[i] = static_cast<int32_t>((i * 7) % P);      // ~5 rows per position
    }
    const std::vector<float> wte = RandomBf16(V * C, 1), wpe = RandomBf16(P * C, 2);
    std::vector<float> want(N * C);
    cpu::EmbeddingForward<float>(want.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);

    Stream stream;
    DeviceArray<int32_t> d_tokens(tokens), d_positions(positions);
    auto d_wte = UploadBf16(wte), d_wpe = UploadBf16(wpe);
    DeviceArray<bf16> d_out(N * C);
    REQUIRE(EmbeddingForward(d_out.get(), d_tokens.get(), d_positions.get(), d_wte.get(), d_wpe.get(), N, C,
                             stream.get())
                .ok());
    CHECK(RelativeError(DownloadBf16(d_out), want) <= 1e-2);

    // Backward accumulates into random fp32 gradients.
    const std::vector<float> dout = RandomBf16(N * C, 3);
    const std::vector<float> dwte0 = RandomNormal(V * C, 4), dwpe0 = RandomNormal(P * C, 5);
    std::vector<float> dwte_want = dwte0, dwpe_want = dwpe0;
    cpu::EmbeddingBackward<float>(dwte_want.data(), dwpe_want.data(), dout.data(), tokens.data(), positions.data(),
                                  N, C);
    DeviceArray<float> d_dwte(dwte0), d_dwpe(dwpe0);
    auto d_dout = UploadBf16(dout);
    REQUIRE(EmbeddingBackward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), d_positions.get(), N, C,
                              stream.get())
                .ok());
    const std::vector<float> dwte = d_dwte.Download(), dwpe = d_dwpe.Download();
    CHECK(RelativeError(dwte, dwte_want) <= 1e-4);
    CHECK(RelativeError(dwpe, dwpe_want) <= 1e-4);
    // The increments themselves (the random start must not hide them).
    CHECK(RelativeError(Minus(dwte, dwte0), Minus(dwte_want, dwte0)) <= 1e-4);
    CHECK(RelativeError(Minus(dwpe, dwpe0), Minus(dwpe_want, dwpe0)) <= 1e-4);
    // Rows of tokens that do not occur are untouched, bit for bit.
    int64_t touched = 0;
    for (int64_t k = kUsedTokens * C; k < V * C; ++k) touched += dwte[k] != dwte0[k];
    CHECK(touched == 0);
  }
}

// ---------------------------------------------------------------- layernorm

TEST_CASE("LayerNormForward/Backward match the CPU backend, rows with a large mean included", "[gpu]") {
  // 6200 > the widest row whose column partials fit in shared memory.
  for (const int64_t C : {768, 1000, 37, 6200}) {
    for (const int64_t N : {1, 129}) {
      INFO("C=" << C << " N=" << N);
      const uint64_t seed = static_cast<uint64_t>(C * 1000 + N);
      std::vector<float> inp = RandomNormal(N * C, seed);
      for (int64_t i = 0; i < N; ++i) {
        if (i % 3 != 1) continue;  // every third row sits at +100: naive E[x^2] - E[x]^2 fails there
        for (int64_t c = 0; c < C; ++c) inp[i * C + c] += 100.0f;
      }
      inp = RoundBf16(inp);
      const std::vector<float> weight = RandomBf16(C, seed + 1, 0.3f, 1.0f);
      const std::vector<float> bias = RandomBf16(C, seed + 2, 0.3f);
      std::vector<float> out_want(N * C), mean_want(N), rstd_want(N);
      cpu::LayerNormForward<float>(out_want.data(), mean_want.data(), rstd_want.data(), inp.data(), weight.data(),
                                   bias.data(), N, C);

      Stream stream;
      auto d_inp = UploadBf16(inp), d_weight = UploadBf16(weight), d_bias = UploadBf16(bias);
      DeviceArray<bf16> d_out(N * C);
      DeviceArray<float> d_mean(N), d_rstd(N);
      REQUIRE(LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(), d_bias.get(),
                               N, C, 1e-5f, stream.get())
                  .ok());
      CHECK(RelativeError(DownloadBf16(d_out), out_want) <= 1e-2);
      const std::vector<float> mean = d_mean.Download(), rstd = d_rstd.Download();
      // Norm-wise for rstd (all ~1); not for the means, whose norm the +100
      // rows dominate (and a single near-zero mean makes a ratio meaningless).
      CHECK(RelativeError(rstd, rstd_want) <= 1e-4);
      CHECK(MaxScaledError(mean, mean_want) <= 1e-4);
      CHECK(MaxScaledError(rstd, rstd_want) <= 1e-4);

      // Backward from the CPU statistics (the same fp32 values on both sides),
      // accumulating into random destinations.
      const std::vector<float> dout = RandomBf16(N * C, seed + 3);
      const std::vector<float> dinp0 = RandomBf16(N * C, seed + 4);
      const std::vector<float> dweight0 = RandomNormal(C, seed + 5), dbias0 = RandomNormal(C, seed + 6);
      std::vector<float> dinp_want = dinp0, dweight_want = dweight0, dbias_want = dbias0;
      cpu::LayerNormBackward<float>(dinp_want.data(), dweight_want.data(), dbias_want.data(), dout.data(),
                                    inp.data(), weight.data(), mean_want.data(), rstd_want.data(), N, C);
      auto d_dout = UploadBf16(dout), d_dinp = UploadBf16(dinp0);
      DeviceArray<float> d_dweight(dweight0), d_dbias(dbias0);
      d_mean.Upload(mean_want);
      d_rstd.Upload(rstd_want);
      REQUIRE(LayerNormBackward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(),
                                d_weight.get(), d_mean.get(), d_rstd.get(), N, C, stream.get())
                  .ok());
      const std::vector<float> dinp = DownloadBf16(d_dinp);
      const std::vector<float> dweight = d_dweight.Download(), dbias = d_dbias.Download();
      CHECK(RelativeError(dinp, dinp_want) <= 1e-2);
      CHECK(RelativeError(Minus(dinp, dinp0), Minus(dinp_want, dinp0)) <= 1e-2);
      CHECK(RelativeError(dweight, dweight_want) <= 1e-4);
      CHECK(RelativeError(dbias, dbias_want) <= 1e-4);
      CHECK(RelativeError(Minus(dweight, dweight0), Minus(dweight_want, dweight0)) <= 1e-4);
      CHECK(RelativeError(Minus(dbias, dbias0), Minus(dbias_want, dbias0)) <= 1e-4);
    }
  }
}

// ---------------------------------------------------------------- gelu

TEST_CASE("GeluForward/Backward match the CPU backend", "[gpu]") {
  for (const int64_t n : {100003, 7}) {  // not multiples of the block size
    INFO("n=" << n);
    const std::vector<float> inp = RandomBf16(n, 21 + n, 2.0f);
    std::vector<float> out_want(n);
    cpu::GeluForward<float>(out_want.data(), inp.data(), n);

    Stream stream;
    auto d_inp = UploadBf16(inp);
    DeviceArray<bf16> d_out(n);
    REQUIRE(GeluForward(d_out.get(), d_inp.get(), n, stream.get()).ok());
    CHECK(RelativeError(DownloadBf16(d_out), out_want) <= 1e-2);

    // The destination starts smaller than the increments: with n = 7 its
    // rounding would otherwise dominate the increment check.
    const std::vector<float> dout = RandomBf16(n, 22 + n), dinp0 = RandomBf16(n, 23 + n, 0.3f);
    std::vector<float> dinp_want = dinp0;
    cpu::GeluBackward<float>(dinp_want.data(), inp.data(), dout.data(), n);
    auto d_dout = UploadBf16(dout), d_dinp = UploadBf16(dinp0);
    REQUIRE(GeluBackward(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream.get()).ok());
    const std::vector<float> dinp = DownloadBf16(d_dinp);
    CHECK(RelativeError(dinp, dinp_want) <= 1e-2);
    CHECK(RelativeError(Minus(dinp, dinp0), Minus(dinp_want, dinp0)) <= 1e-2);
  }
}

// ---------------------------------------------------------------- model.block's other parts

TEST_CASE("RmsNormForward/Backward and LayerNorm without a shift match the CPU backend", "[gpu]") {
  for (const int64_t C : {768, 37, 13000}) {  // 13000: column partials past shared memory
    const int64_t N = 129;
    INFO("C=" << C);
    const uint64_t seed = static_cast<uint64_t>(C * 7 + 1);
    const std::vector<float> inp = RandomBf16(N * C, seed, 2.0f);
    const std::vector<float> weight = RandomBf16(C, seed + 1, 0.3f, 1.0f);
    std::vector<float> out_want(N * C), rstd_want(N);
    cpu::RmsNormForward<float>(out_want.data(), rstd_want.data(), inp.data(), weight.data(), N, C);
    Stream stream;
    auto d_inp = UploadBf16(inp), d_weight = UploadBf16(weight);
    DeviceArray<bf16> d_out(N * C);
    DeviceArray<float> d_rstd(N);
    REQUIRE(RmsNormForward(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), N, C, 1e-6f, stream.get()).ok());
    CHECK(RelativeError(DownloadBf16(d_out), out_want) <= 1e-2);
    CHECK(MaxScaledError(d_rstd.Download(), rstd_want) <= 1e-4);

    const std::vector<float> dout = RandomBf16(N * C, seed + 3), dinp0 = RandomBf16(N * C, seed + 4);
    const std::vector<float> dweight0 = RandomNormal(C, seed + 5);
    std::vector<float> dinp_want = dinp0, dweight_want = dweight0;
    cpu::RmsNormBackward<float>(dinp_want.data(), dweight_want.data(), dout.data(), inp.data(), weight.data(),
                                rstd_want.data(), N, C);
    auto d_dout = UploadBf16(dout), d_dinp = UploadBf16(dinp0);
    DeviceArray<float> d_dweight(dweight0);
    d_rstd.Upload(rstd_want);
    REQUIRE(RmsNormBackward(d_dinp.get(), d_dweight.get(), d_dout.get(), d_inp.get(), d_weight.get(), d_rstd.get(),
                            N, C, stream.get())
                .ok());
    const std::vector<float> dinp = DownloadBf16(d_dinp), dweight = d_dweight.Download();
    CHECK(RelativeError(Minus(dinp, dinp0), Minus(dinp_want, dinp0)) <= 1e-2);
    CHECK(RelativeError(Minus(dweight, dweight0), Minus(dweight_want, dweight0)) <= 1e-4);

    // LayerNorm with a null shift: as with a zero one, and no bias gradient.
    std::vector<float> ln_want(N * C), mean(N), rstd(N);
    cpu::LayerNormForward<float>(ln_want.data(), mean.data(), rstd.data(), inp.data(), weight.data(), nullptr, N, C);
    DeviceArray<float> d_mean(N);
    REQUIRE(LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(), nullptr, N, C,
                             1e-5f, stream.get())
                .ok());
    CHECK(RelativeError(DownloadBf16(d_out), ln_want) <= 1e-2);
    std::vector<float> ln_dinp_want = dinp0, ln_dweight_want = dweight0;
    cpu::LayerNormBackward<float>(ln_dinp_want.data(), ln_dweight_want.data(), nullptr, dout.data(), inp.data(),
                                  weight.data(), mean.data(), rstd.data(), N, C);
    auto d_ln_dinp = UploadBf16(dinp0);
    DeviceArray<float> d_ln_dweight(dweight0);
    d_mean.Upload(mean);
    d_rstd.Upload(rstd);
    REQUIRE(LayerNormBackward(d_ln_dinp.get(), d_ln_dweight.get(), nullptr, d_dout.get(), d_inp.get(),
                              d_weight.get(), d_mean.get(), d_rstd.get(), N, C, stream.get())
                .ok());
    CHECK(RelativeError(Minus(DownloadBf16(d_ln_dinp), dinp0), Minus(ln_dinp_want, dinp0)) <= 1e-2);
    CHECK(RelativeError(Minus(d_ln_dweight.Download(), dweight0), Minus(ln_dweight_want, dweight0)) <= 1e-4);
  }
}

TEST_CASE("ReLU and gated GELU forward/backward match the CPU backend", "[gpu]") {
  const int64_t N = 301, F = 257;  // not multiples of the block size
  Stream stream;
  const std::vector<float> inp = RandomBf16(N * 2 * F, 31, 2.0f);
  const std::vector<float> dout = RandomBf16(N * F, 32), dinp0 = RandomBf16(N * 2 * F, 33, 0.3f);
  auto d_inp = UploadBf16(inp), d_dout = UploadBf16(dout);
  DeviceArray<bf16> d_out(N * F);
  {  // ReLU on the first N * F inputs
    const std::vector<float> x(inp.begin(), inp.begin() + N * F), d0(dinp0.begin(), dinp0.begin() + N * F);
    std::vector<float> want(N * F), dwant = d0;
    cpu::ReluForward<float>(want.data(), x.data(), N * F);
    cpu::ReluBackward<float>(dwant.data(), x.data(), dout.data(), N * F);
    REQUIRE(ReluForward(d_out.get(), d_inp.get(), N * F, stream.get()).ok());
    CHECK(RelativeError(DownloadBf16(d_out), want) <= 1e-2);
    auto d_d = UploadBf16(d0);
    REQUIRE(ReluBackward(d_d.get(), d_inp.get(), d_dout.get(), N * F, stream.get()).ok());
    CHECK(RelativeError(Minus(DownloadBf16(d_d), d0), Minus(dwant, d0)) <= 1e-2);
  }
  std::vector<float> want(N * F), dwant = dinp0;
  cpu::GatedGeluForward<float>(want.data(), inp.data(), N, F);
  cpu::GatedGeluBackward<float>(dwant.data(), inp.data(), dout.data(), N, F);
  REQUIRE(GatedGeluForward(d_out.get(), d_inp.get(), N, F, stream.get()).ok());
  CHECK(RelativeError(DownloadBf16(d_out), want) <= 1e-2);
  auto d_dinp = UploadBf16(dinp0);
  REQUIRE(GatedGeluBackward(d_dinp.get(), d_inp.get(), d_dout.get(), N, F, stream.get()).ok());
  CHECK(RelativeError(Minus(DownloadBf16(d_dinp), dinp0), Minus(dwant, dinp0)) <= 1e-2);
}

TEST_CASE("SwiGLU forward/backward match the CPU backend (saturated gates too)", "[gpu]") {
  const int64_t N = 301, F = 257;  // not multiples of the block size
  std::vector<float> inp = RandomNormal(N * 2 * F, 41, 2.0f);
  // Gates far out on both sides: exp(-gate) overflows (silu 0) or vanishes (silu = gate).
  for (int64_t i = 0; i < N; i += 7) {
    inp[i * 2 * F] = -120.0f;
    inp[i * 2 * F + 1] = 95.0f;
  }
  inp = RoundBf16(inp);
  const std::vector<float> dout = RandomBf16(N * F, 42), dinp0 = RandomBf16(N * 2 * F, 43, 0.3f);
  std::vector<float> want(N * F), dwant = dinp0;
  cpu::SwigluForward<float>(want.data(), inp.data(), N, F);
  cpu::SwigluBackward<float>(dwant.data(), inp.data(), dout.data(), N, F);
  Stream stream;
  auto d_inp = UploadBf16(inp), d_dout = UploadBf16(dout), d_dinp = UploadBf16(dinp0);
  DeviceArray<bf16> d_out(N * F);
  REQUIRE(SwigluForward(d_out.get(), d_inp.get(), N, F, stream.get()).ok());
  const std::vector<float> out = DownloadBf16(d_out);
  CHECK(RelativeError(out, want) <= 1e-2);
  REQUIRE(SwigluBackward(d_dinp.get(), d_inp.get(), d_dout.get(), N, F, stream.get()).ok());
  const std::vector<float> dinp = DownloadBf16(d_dinp);
  // Gate and up halves apart: each has its own formula.
  std::vector<float> dgate, dgate_want, dup, dup_want;
  for (int64_t k = 0; k < N * 2 * F; ++k) {
    const bool gate = k % (2 * F) < F;
    (gate ? dgate : dup).push_back(dinp[k] - dinp0[k]);
    (gate ? dgate_want : dup_want).push_back(dwant[k] - dinp0[k]);
  }
  CHECK(RelativeError(dgate, dgate_want) <= 1e-2);
  CHECK(RelativeError(dup, dup_want) <= 1e-2);
  int64_t not_finite = 0;
  for (float x : out) not_finite += !std::isfinite(x);
  for (float x : dinp) not_finite += !std::isfinite(x);
  CHECK(not_finite == 0);
}

// Llama's RMS norm epsilon is 1e-5, T5's 1e-6: on rows whose mean square is
// of that order the two give different outputs, so a kernel ignoring its
// epsilon fails here (on the rows of the tests above it would not show).
TEST_CASE("RmsNormForward and LayerNormForward add the caller's epsilon (1e-5 and 1e-6)", "[gpu]") {
  const int64_t N = 67, C = 256;
  const std::vector<float> inp = RandomBf16(N * C, 51, 3e-3f);  // mean square ~1e-5
  const std::vector<float> weight = RandomBf16(C, 52, 0.3f, 1.0f);
  Stream stream;
  auto d_inp = UploadBf16(inp), d_weight = UploadBf16(weight);
  DeviceArray<bf16> d_out(N * C);
  DeviceArray<float> d_mean(N), d_rstd(N);
  std::vector<float> rms_rstd[2];
  const double eps_values[2] = {1e-5, 1e-6};
  for (int e = 0; e < 2; ++e) {
    const double eps = eps_values[e];
    INFO("eps " << eps);
    std::vector<float> want(N * C), rstd_want(N), mean_want(N);
    cpu::RmsNormForward<float>(want.data(), rstd_want.data(), inp.data(), weight.data(), N, C, eps);
    REQUIRE(RmsNormForward(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), N, C, static_cast<float>(eps),
                           stream.get())
                .ok());
    CHECK(RelativeError(DownloadBf16(d_out), want) <= 1e-2);
    rms_rstd[e] = d_rstd.Download();
    CHECK(RelativeError(rms_rstd[e], rstd_want) <= 1e-4);
    cpu::LayerNormForward<float>(want.data(), mean_want.data(), rstd_want.data(), inp.data(), weight.data(), nullptr,
                                 N, C, eps);
    REQUIRE(LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(), nullptr, N, C,
                             static_cast<float>(eps), stream.get())
                .ok());
    CHECK(RelativeError(DownloadBf16(d_out), want) <= 1e-2);
    CHECK(RelativeError(d_rstd.Download(), rstd_want) <= 1e-4);
  }
  // The epsilon mattered: 1e-5 is about the rows' mean square.
  CHECK(RelativeError(rms_rstd[0], rms_rstd[1]) > 0.2);
}

// ---------------------------------------------------------------- cross-entropy

TEST_CASE("SoftmaxCrossEntropy matches the CPU backend (loss, row losses, dlogits)", "[gpu]") {
  struct Shape {
    int64_t N, V;
  };
  for (const Shape shape : {Shape{19, 50257}, Shape{300, 97}}) {
    const int64_t N = shape.N, V = shape.V;
    INFO("N=" << N << " V=" << V);
    const uint64_t seed = static_cast<uint64_t>(V + N);
    const std::vector<float> logits = RandomBf16(N * V, seed, 2.0f);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<int32_t> targets(N);
    int64_t scored = 0;
    for (int64_t i = 0; i < N; ++i) targets[i] = i % 4 == 2 ? -1 : static_cast<int32_t>(rng() % V);
    targets[N - 1] = static_cast<int32_t>(V - 1);  // the last class of the last row
    for (int32_t t : targets) scored += t >= 0;
    const float scale = 1.0f / static_cast<float>(scored);

    // Reference in double on the rounded logits: total, per row, gradient.
    const std::vector<double> logits_d = ToDouble(logits);
    std::vector<double> probs(N * V);
    const double loss_want =
        cpu::CrossEntropyForward<double>(probs.data(), logits_d.data(), targets.data(), scale, N, V);
    std::vector<float> row_want(N);
    std::vector<double> row_probs(V);
    for (int64_t i = 0; i < N; ++i) {
      row_want[i] = static_cast<float>(cpu::CrossEntropyForward<double>(row_probs.data(), logits_d.data() + i * V,
                                                                        targets.data() + i, scale, 1, V));
    }
    // dlogits starts at values of the size of the softmax terms.
    const std::vector<float> dlogits0 = RandomBf16(N * V, seed + 1, scale / static_cast<float>(V));
    std::vector<double> dlogits_d = ToDouble(dlogits0);
    cpu::CrossEntropyBackward<double>(dlogits_d.data(), probs.data(), targets.data(), scale, N, V);
    const std::vector<float> dlogits_want(dlogits_d.begin(), dlogits_d.end());

    Stream stream;
    auto d_logits = UploadBf16(logits), d_dlogits = UploadBf16(dlogits0);
    DeviceArray<int32_t> d_targets(targets);
    DeviceArray<float> d_loss(std::vector<float>{0.25f});
    DeviceArray<float> d_rows(std::vector<float>(N, 7.0f));  // garbage: every row is written
    REQUIRE(SoftmaxCrossEntropy(d_loss.get(), d_rows.get(), d_dlogits.get(), d_logits.get(), d_targets.get(), scale,
                                N, V, stream.get())
                .ok());
    const float loss = d_loss.Download()[0];
    CHECK(std::fabs((loss - 0.25) - loss_want) <= 1e-4 * loss_want);
    const std::vector<float> rows = d_rows.Download();
    CHECK(RelativeError(rows, row_want) <= 1e-4);
    int64_t bad_ignored_rows = 0;
    for (int64_t i = 0; i < N; ++i) bad_ignored_rows += targets[i] < 0 && rows[i] != 0.0f;
    CHECK(bad_ignored_rows == 0);

    const std::vector<float> dlogits = DownloadBf16(d_dlogits);
    CHECK(RelativeError(dlogits, dlogits_want) <= 1e-2);
    // Split: the target entries (~ -scale) would otherwise hide the softmax
    // terms, and the random start must not hide either.
    std::vector<float> got_soft, want_soft, got_tgt, want_tgt;
    int64_t changed_ignored = 0;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t v = 0; v < V; ++v) {
        const int64_t k = i * V + v;
        if (targets[i] < 0) {
          changed_ignored += dlogits[k] != dlogits0[k];  // bit for bit unchanged
        } else if (v == targets[i]) {
          got_tgt.push_back(dlogits[k] - dlogits0[k]);
          want_tgt.push_back(dlogits_want[k] - dlogits0[k]);
        } else {
          got_soft.push_back(dlogits[k] - dlogits0[k]);
          want_soft.push_back(dlogits_want[k] - dlogits0[k]);
        }
      }
    }
    CHECK(changed_ignored == 0);
    CHECK(RelativeError(got_soft, want_soft) <= 1e-2);
    CHECK(RelativeError(got_tgt, want_tgt) <= 1e-2);

    // Loss only (no gradient): same loss, bit for bit the same on a rerun.
    float first = 0;
    for (int run = 0; run < 2; ++run) {
      d_loss.Upload({0.0f});
      REQUIRE(SoftmaxCrossEntropy(d_loss.get(), d_rows.get(), nullptr, d_logits.get(), d_targets.get(), scale, N, V,
                                  stream.get())
                  .ok());
      const float l = d_loss.Download()[0];
      CHECK(std::fabs(l - loss_want) <= 1e-4 * loss_want);
      if (run == 0) first = l;
      CHECK(l == first);
    }
  }
}

TEST_CASE("SoftmaxCrossEntropy of an all-ignored batch adds no loss and leaves dlogits unchanged", "[gpu]") {
  const int64_t N = 5, V = 97;
  const std::vector<float> logits = RandomBf16(N * V, 31), dlogits0 = RandomBf16(N * V, 32);
  const std::vector<int32_t> targets(N, -1);
  Stream stream;
  auto d_logits = UploadBf16(logits), d_dlogits = UploadBf16(dlogits0);
  DeviceArray<int32_t> d_targets(targets);
  DeviceArray<float> d_loss(std::vector<float>{0.0f});
  DeviceArray<float> d_rows(std::vector<float>(N, 7.0f));
  REQUIRE(SoftmaxCrossEntropy(d_loss.get(), d_rows.get(), d_dlogits.get(), d_logits.get(), d_targets.get(), 0.5f, N,
                              V, stream.get())
              .ok());
  CHECK(d_loss.Download()[0] == 0.0f);
  CHECK(d_rows.Download() == std::vector<float>(N, 0.0f));
  CHECK(DownloadBf16(d_dlogits) == dlogits0);
}

// ---------------------------------------------------------------- arguments

// These return before touching the device, so they run without a GPU.
TEST_CASE("Layer launchers reject bad sizes and accept empty work") {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  CHECK(EmbeddingForward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, -1, nullptr).code() == kInvalid);
  CHECK(EmbeddingForward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8, nullptr).code() == kInvalid);
  CHECK(EmbeddingBackward(nullptr, nullptr, nullptr, nullptr, nullptr, -1, 8, nullptr).code() == kInvalid);
  CHECK(EmbeddingBackward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr).ok());

  CHECK(LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 3, 0, 1e-5f, nullptr).code() == kInvalid);
  CHECK(LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 3, 8, 1e-5f, nullptr).code() == kInvalid);
  CHECK(LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, 1e-5f, nullptr).ok());
  // An epsilon that is not positive and finite, before anything else.
  CHECK(LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, 0.0f, nullptr).code() == kInvalid);
  CHECK(RmsNormForward(nullptr, nullptr, nullptr, nullptr, 0, 8, -1e-6f, nullptr).code() == kInvalid);
  CHECK(RmsNormForward(nullptr, nullptr, nullptr, nullptr, 0, 8, INFINITY, nullptr).code() == kInvalid);
  CHECK(RmsNormForward(nullptr, nullptr, nullptr, nullptr, 0, 8, 1e-5f, nullptr).ok());
  CHECK(LayerNormBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 8, nullptr)
            .code() == kInvalid);
  CHECK(LayerNormBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr).ok());

  CHECK(GeluForward(nullptr, nullptr, -1, nullptr).code() == kInvalid);
  CHECK(GeluForward(nullptr, nullptr, 0, nullptr).ok());
  CHECK(GeluBackward(nullptr, nullptr, nullptr, 10, nullptr).code() == kInvalid);
  CHECK(SwigluForward(nullptr, nullptr, 4, 0, nullptr).code() == kInvalid);
  CHECK(SwigluForward(nullptr, nullptr, 4, 8, nullptr).code() == kInvalid);
  CHECK(SwigluForward(nullptr, nullptr, 0, 8, nullptr).ok());
  CHECK(SwigluBackward(nullptr, nullptr, nullptr, -1, 8, nullptr).code() == kInvalid);

  CHECK(SoftmaxCrossEntropy(nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f, -1, 97, nullptr).code() == kInvalid);
  CHECK(SoftmaxCrossEntropy(nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f, 2, 0, nullptr).code() == kInvalid);
  CHECK(SoftmaxCrossEntropy(nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f, 2, 97, nullptr).code() == kInvalid);
  CHECK(SoftmaxCrossEntropy(nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f, 0, 97, nullptr).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
