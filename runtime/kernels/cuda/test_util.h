#pragma once

// Test support for the CUDA kernels: RAII device buffers, a stream, bf16
// rounding on the host, seeded random inputs and the error measure the
// acceptance criteria use. Compiled by the host compiler; tests that use it
// are tagged [gpu].

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "src/testing/status_require.h"

namespace dynapipe::runtime::cuda::testing {

using bf16 = __nv_bfloat16;

// fp32 -> bf16 bits, round to nearest even (finite inputs), on the host.
inline bf16 HostBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  __nv_bfloat16_raw raw;
  raw.x = static_cast<uint16_t>(bits >> 16);
  return bf16(raw);
}
inline float HostF32(bf16 b) {
  const __nv_bfloat16_raw raw(b);
  const uint32_t bits = static_cast<uint32_t>(raw.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
// Rounds every element to the nearest bf16 value (kept as float).
inline std::vector<float> RoundBf16(std::vector<float> v) {
  for (float& x : v) x = HostF32(HostBf16(x));
  return v;
}
inline std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = HostBf16(v[i]);
  return out;
}
inline std::vector<float> ToF32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = HostF32(v[i]);
  return out;
}

// The raw bits of a bf16 value (for exact comparisons).
inline uint16_t Bits(bf16 b) { return __nv_bfloat16_raw(b).x; }

// N(0, std) values from `seed` (never all zeros).
inline std::vector<float> RandomNormal(size_t n, uint64_t seed, float std = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, std);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ||got - want||_2 / ||want||_2 (the norm-wise relative error of the
// acceptance criteria: bf16 paths <= 1e-2, fp32 paths <= 1e-4).
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  REQUIRE(den > 0);  // a zero reference would make any comparison vacuous
  return std::sqrt(num / den);
}

#define CUDA_REQUIRE(expr) REQUIRE((expr) == cudaSuccess)

// A device array of n elements of T; freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ > 0) CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ > 0) CUDA_REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the data lands, and
    // the legacy stream does not order non-blocking streams: wait here.
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  void Zero() {
    if (n_ > 0) CUDA_REQUIRE(cudaMemset(ptr_, 0, n_ * sizeof(T)));
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  // Synchronises the device first, so pending kernels on any stream finish.
  std::vector<T> Download() const {
    CUDA_REQUIRE(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    if (n_ > 0) CUDA_REQUIRE(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

// bf16 device copy of float host values (rounded).
// seg (B, T) for attention tests: row b holds samples of lengths rows[b]
// one after another (segment ids 0, 1, ...), then padding (-1).
inline std::vector<int32_t> PackedSegments(int64_t T, const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> seg(rows.size() * T, -1);
  for (size_t b = 0; b < rows.size(); ++b) {
    int64_t t = 0;
    for (size_t s = 0; s < rows[b].size(); ++s) {
      for (int64_t k = 0; k < rows[b][s]; ++k) seg[b * T + t++] = static_cast<int32_t>(s);
    }
    REQUIRE(t <= T);
  }
  return seg;
}

inline DeviceArray<bf16> UploadBf16(const std::vector<float>& v) { return DeviceArray<bf16>(ToBf16(v)); }
inline std::vector<float> DownloadBf16(const DeviceArray<bf16>& d) { return ToF32(d.Download()); }

class Stream {
 public:
  Stream() { CUDA_REQUIRE(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void Sync() const { CUDA_REQUIRE(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

// Holds a stream at a host function until Open() (or 20 s, so a failing
// test cannot hang the suite): work queued behind it cannot start.
class Gate {
 public:
  void Block(cudaStream_t s) { CUDA_REQUIRE(cudaLaunchHostFunc(s, &Gate::Hold, this)); }
  void Open() { open_.store(true); }

 private:
  static void Hold(void* self) {
    auto* g = static_cast<Gate*>(self);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!g->open_.load() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> open_{false};
};

}  // namespace dynapipe::runtime::cuda::testing
