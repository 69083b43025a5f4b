#include "runtime/kernels/cuda/optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "runtime/kernels/cuda/test_util.h"
#include "runtime/optim/adamw.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::bf16;
using testing::Bits;
using testing::DeviceArray;
using testing::HostBf16;
using testing::RandomNormal;
using testing::RelativeError;
using testing::Stream;

// A device array of n + offset elements, used from element `offset` on (an
// offset of 1 breaks 16-byte alignment and exercises the scalar paths).
template <typename T>
struct Buffer {
  Buffer(const std::vector<T>& host, int64_t offset) : array(host.size() + offset), offset(offset) {
    std::vector<T> padded(offset, T{});
    padded.insert(padded.end(), host.begin(), host.end());
    array.Upload(padded);
  }
  T* get() const { return array.get() + offset; }
  std::vector<T> Download() const {
    const std::vector<T> all = array.Download();
    return std::vector<T>(all.begin() + offset, all.end());
  }
  DeviceArray<T> array;
  int64_t offset;
};

// Five AdamW steps on the device and with optim::AdamWStep from the same
// start; hyper-parameters are floats so both sides use identical values.
void CheckAdamW(int64_t n, int64_t offset, const AdamWParams& hp, uint64_t seed) {
  INFO("n=" << n << " offset=" << offset << " lr=" << hp.lr << " wd=" << hp.weight_decay
            << " grad_scale=" << hp.grad_scale);
  std::vector<float> params = RandomNormal(n, seed);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  Buffer<float> d_params(params, offset), d_m(m, offset), d_v(v, offset);
  Buffer<bf16> d_bf16(std::vector<bf16>(n, HostBf16(7.0f)), offset);
  const optim::AdamWConfig cfg{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay};
  Stream stream;
  for (int64_t step = 1; step <= 5; ++step) {
    const std::vector<float> grads = RandomNormal(n, seed + 100 * step, 0.5f);
    std::vector<float> scaled = grads;  // what optim::ClipByGlobalNorm leaves
    for (float& g : scaled) g = static_cast<float>(g * static_cast<double>(hp.grad_scale));
    optim::AdamWStep(params, scaled, m, v, cfg, cfg.lr, step);

    Buffer<float> d_grads(grads, offset);
    AdamWParams p = hp;
    p.step = step;
    REQUIRE_OK(AdamWStep(d_params.get(), d_bf16.get(), d_grads.get(), d_m.get(), d_v.get(), n, p, stream.get()));
    stream.Sync();
  }
  const std::vector<float> got = d_params.Download();
  const double params_err = RelativeError(got, params);
  INFO("params relative error " << params_err);
  CHECK(params_err <= 1e-4);  // the acceptance bound
  CHECK(params_err <= 1e-6);  // fp32 vs double per element: a few ulps
  CHECK(RelativeError(d_m.Download(), m) <= 1e-5);
  CHECK(RelativeError(d_v.Download(), v) <= 1e-5);
  const std::vector<bf16> copy = d_bf16.Download();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) mismatches += Bits(copy[i]) != Bits(HostBf16(got[i]));
  CHECK(mismatches == 0);
}

TEST_CASE("AdamWStep matches optim::AdamWStep over five steps", "[gpu]") {
  // Typical settings, and aggressive ones where the weight decay term and the
  // bias corrections move parameters by much more than rounding.
  const AdamWParams typical{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  const AdamWParams aggressive{0.05f, 0.8f, 0.99f, 1e-6f, 0.5f, 1};
  AdamWParams clipped = typical;
  clipped.grad_scale = 0.37f;
  uint64_t seed = 1;
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1003}, int64_t{(1 << 20) + 3}}) {
    for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
      CheckAdamW(n, offset, typical, seed++);
      CheckAdamW(n, offset, aggressive, seed++);
      CheckAdamW(n, offset, clipped, seed++);
    }
  }
}

TEST_CASE("AdamWStep without a bf16 copy updates the fp32 state only", "[gpu]") {
  const int64_t n = 4099;
  const AdamWParams hp{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  std::vector<float> params = RandomNormal(n, 3), m(n, 0.0f), v(n, 0.0f);
  const std::vector<float> grads = RandomNormal(n, 4);
  DeviceArray<float> d_params(params), d_grads(grads), d_m(m), d_v(v);
  Stream stream;
  REQUIRE_OK(AdamWStep(d_params.get(), nullptr, d_grads.get(), d_m.get(), d_v.get(), n, hp, stream.get()));
  const optim::AdamWConfig cfg{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay};
  optim::AdamWStep(params, grads, m, v, cfg, cfg.lr, 1);
  CHECK(RelativeError(d_params.Download(), params) <= 1e-6);
}

TEST_CASE("AdamWStep on a sub-range (the GPT stage's parameter groups) touches that range only", "[gpu]") {
  // Zero gradients: only the decay term moves a parameter, p -> p (1 - lr wd).
  const int64_t n = 1000, begin = 8, count = 200;
  const std::vector<float> params = RandomNormal(n, 41), zeros(n, 0.0f);
  DeviceArray<float> d_params(params), d_grads(zeros), d_m(zeros), d_v(zeros);
  DeviceArray<bf16> d_bf16(std::vector<bf16>(n, HostBf16(7.0f)));
  const AdamWParams decay{0.1f, 0.9f, 0.95f, 1e-8f, 0.5f, 1};
  AdamWParams no_decay = decay;
  no_decay.weight_decay = 0;
  Stream stream;
  REQUIRE_OK(AdamWStep(d_params.get() + begin, d_bf16.get() + begin, d_grads.get() + begin, d_m.get() + begin,
                       d_v.get() + begin, count, decay, stream.get()));
  REQUIRE_OK(AdamWStep(d_params.get() + begin + count, d_bf16.get() + begin + count, d_grads.get() + begin + count,
                       d_m.get() + begin + count, d_v.get() + begin + count, 16, no_decay, stream.get()));
  const std::vector<float> got = d_params.Download();
  const std::vector<bf16> copy = d_bf16.Download();
  for (int64_t i = 0; i < n; ++i) {
    INFO("i=" << i);
    if (i >= begin && i < begin + count) {
      REQUIRE(std::abs(got[i] - params[i] * 0.95f) <= 1e-6f * std::abs(params[i]));
      REQUIRE(Bits(copy[i]) == Bits(HostBf16(got[i])));
    } else if (i >= begin + count && i < begin + count + 16) {
      REQUIRE(got[i] == params[i]);  // no decay, no gradient: unchanged
      REQUIRE(Bits(copy[i]) == Bits(HostBf16(params[i])));
    } else {
      REQUIRE(got[i] == params[i]);  // outside both launches
      REQUIRE(Bits(copy[i]) == Bits(HostBf16(7.0f)));
    }
  }
}

double HostSumOfSquares(const std::vector<float>& x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

double RelativeDiff(double got, double want) { return std::abs(got - want) / std::abs(want); }

TEST_CASE("SumOfSquares matches a double host sum", "[gpu]") {
  Stream stream;
  uint64_t seed = 10;
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{4096 * 3 + 5}, int64_t{3000007}}) {
    for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
      INFO("n=" << n << " offset=" << offset);
      const std::vector<float> x = RandomNormal(n, seed++, 2.0f);
      Buffer<float> d_x(x, offset);
      DeviceArray<double> out(std::vector<double>{0.0});
      REQUIRE_OK(SumOfSquares(d_x.get(), n, out.get(), stream.get()));
      const double got = out.Download()[0];
      const double want = HostSumOfSquares(x, n);
      CHECK(RelativeDiff(got, want) <= 1e-6);
      CHECK(RelativeDiff(got, want) <= 1e-9);  // double accumulation throughout
      // Deterministic: a second run gives the same bits.
      out.Zero();
      REQUIRE_OK(SumOfSquares(d_x.get(), n, out.get(), stream.get()));
      CHECK(out.Download()[0] == got);
    }
  }
}

TEST_CASE("SumOfSquares accumulates several tensors into one scalar", "[gpu]") {
  const std::vector<float> a = RandomNormal(3000007, 21), b = RandomNormal(777, 22, 3.0f);
  DeviceArray<float> d_a(a), d_b(b);
  DeviceArray<double> out(std::vector<double>{12.5});
  Stream stream;
  REQUIRE_OK(SumOfSquares(d_a.get(), static_cast<int64_t>(a.size()), out.get(), stream.get()));
  REQUIRE_OK(SumOfSquares(d_b.get(), static_cast<int64_t>(b.size()), out.get(), stream.get()));
  REQUIRE_OK(SumOfSquares(d_b.get(), 0, out.get(), stream.get()));  // no-op
  const double want = 12.5 + HostSumOfSquares(a, a.size()) + HostSumOfSquares(b, b.size());
  CHECK(RelativeDiff(out.Download()[0], want) <= 1e-6);
}

TEST_CASE("Optimizer launchers reject bad arguments before touching the device") {
  // Host-side checks only: null device pointers are never dereferenced.
  float* const f = nullptr;
  const AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  CHECK(AdamWStep(f, nullptr, f, f, f, -1, hp, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(AdamWStep(f, nullptr, f, f, f, 10, hp, nullptr).code() == absl::StatusCode::kInvalidArgument);
  AdamWParams bad = hp;
  bad.step = 0;
  CHECK(AdamWStep(f, nullptr, f, f, f, 0, bad, nullptr).code() == absl::StatusCode::kInvalidArgument);
  bad = hp;
  bad.beta1 = 1.0f;
  CHECK(AdamWStep(f, nullptr, f, f, f, 0, bad, nullptr).code() == absl::StatusCode::kInvalidArgument);
  bad = hp;
  bad.beta2 = -0.5f;
  CHECK(AdamWStep(f, nullptr, f, f, f, 0, bad, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(AdamWStep(f, nullptr, f, f, f, 0, hp, nullptr).ok());  // nothing to do

  CHECK(SumOfSquares(f, -1, nullptr, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(SumOfSquares(f, 5, nullptr, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(SumOfSquares(f, 0, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
