#include "runtime/kernels/cuda/cast.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/test_util.h"
#include "src/common/keyed_normal.h"

namespace dynapipe::runtime::cuda {
namespace {

// The reference fp32 -> bf16 rounding is test_util's HostBf16, written
// independently of the device intrinsic. Inputs here are finite.
uint16_t ReferenceBf16(float f) { return testing::Bits(testing::HostBf16(f)); }

TEST_CASE("CastF32ToBf16 rounds like the reference and CastBf16ToF32 is exact", "[gpu]") {
  const int64_t n = 1 << 20;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> host(n);
  for (auto& x : host) x = dist(rng);

  float* d_in = nullptr;
  uint16_t* d_bf16 = nullptr;
  float* d_back = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d_in), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d_bf16), n * sizeof(uint16_t)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d_back), n * sizeof(float)) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(d_in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  REQUIRE(CastF32ToBf16(d_in, d_bf16, n, stream).ok());
  REQUIRE(CastBf16ToF32(d_bf16, d_back, n, stream).ok());
  std::vector<uint16_t> bf16(n);
  std::vector<float> back(n);
  REQUIRE(cudaMemcpyAsync(bf16.data(), d_bf16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(back.data(), d_back, n * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);

  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    mismatches += bf16[i] != ReferenceBf16(host[i]);
    uint32_t bits = static_cast<uint32_t>(bf16[i]) << 16;
    float expect;
    std::memcpy(&expect, &bits, sizeof(expect));
    mismatches += back[i] != expect;
  }
  CHECK(mismatches == 0);

  REQUIRE(FillF32(d_back, 2.5f, n, stream).ok());
  REQUIRE(cudaMemcpyAsync(back.data(), d_back, n * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  int64_t wrong_fill = 0;
  for (float x : back) wrong_fill += x != 2.5f;
  CHECK(wrong_fill == 0);

  cudaStreamDestroy(stream);
  cudaFree(d_in);
  cudaFree(d_bf16);
  cudaFree(d_back);
}

TEST_CASE("FillKeyedNormal draws the host generator's bits", "[gpu]") {
  const int64_t n = (int64_t{1} << 22) + 3;  // several grid-stride rounds and a ragged end
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)) == cudaSuccess);
  std::vector<float> got(n);
  int64_t mismatches = 0;
  for (const auto& [key, std] : {std::pair<uint64_t, float>{keyed_normal::StreamKey(1, "wte", 3), 0.02f},
                                 std::pair<uint64_t, float>{keyed_normal::StreamKey(9, "h.7.mlp.proj.w", 14), 0.0035f},
                                 std::pair<uint64_t, float>{~uint64_t{0} - 5, 1.0f}}) {
    REQUIRE(FillKeyedNormal(d, key, std, n, nullptr).ok());
    REQUIRE(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int64_t i = 0; i < n; ++i) mismatches += got[i] != keyed_normal::Normal(key, static_cast<uint64_t>(i), std);
  }
  CHECK(mismatches == 0);
  cudaFree(d);
}

TEST_CASE("CudaStatus carries the CUDA error name") {
  const absl::Status s = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc");
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(s.message().find("cudaErrorMemoryAllocation") != absl::string_view::npos);
  CHECK(CudaStatus(cudaSuccess, "x").ok());
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
