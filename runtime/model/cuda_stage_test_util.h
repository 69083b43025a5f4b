#pragma once

// What the CUDA stages' tests share (gpt_cuda_test, llama_cuda_test,
// t5_cuda_test): a device with a stream and a pool over it, host views of a
// stage's state through the backend-neutral Stage interface, and bf16 device
// buffers.

#include <cuda_bf16.h>

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/kernels/cuda/test_util.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cuda_stage.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::model::testing {

// Through the Stage interface, so the same code reads and writes either backend.
inline std::vector<float> Params(Stage& s) {
  StageState st;
  REQUIRE_OK(s.ExportState(&st));
  return st.params;
}
inline void SetParams(Stage& s, std::vector<float> params) {
  StageState st;
  st.adam_m.assign(params.size(), 0.0f);
  st.adam_v.assign(params.size(), 0.0f);
  st.params = std::move(params);
  REQUIRE_OK(s.ImportState(st));
}
// The stage's initial parameters rounded to bf16, so both backends start
// from identical values (initial values depend on names only, so a split
// stage gets the whole model's values).
inline void RoundParams(Stage& s) { SetParams(s, cuda::testing::RoundBf16(Params(s))); }
inline std::vector<float> Slice(std::span<const float> all, const ParamInfo& p) {
  return std::vector<float>(all.begin() + p.offset, all.begin() + p.offset + p.size);
}

// The device, a pool over it and a compute stream, in destruction order.
struct TestGpu {
  cuda::testing::Stream stream;
  cuda::CudaAllocator allocator;
  cuda::CudaEventFences fences;
  BufferPool pool{&allocator, &fences};

  std::vector<float> Grads(CudaStageBase& s) {
    std::vector<float> g(s.num_params());
    REQUIRE_OK(s.CopyGradsToHost(g));
    return g;
  }
  // A device buffer of `bytes` (at least 16) from the pool.
  Buffer Bytes(size_t bytes) {
    auto b = pool.Get(std::max<size_t>(bytes, 16), cuda::Handle(stream.get()));
    REQUIRE_OK(b.status());
    return std::move(*b);
  }
  // bf16 device buffer of n elements from the pool.
  Buffer Bf16(int64_t n) { return Bytes(static_cast<size_t>(n) * sizeof(__nv_bfloat16)); }
  std::vector<float> Download(const Buffer& b, int64_t n) {
    std::vector<__nv_bfloat16> h(n);
    CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
    CUDA_REQUIRE(cudaMemcpy(h.data(), b.data(), n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    return cuda::testing::ToF32(h);
  }
};

}  // namespace dynapipe::runtime::model::testing
