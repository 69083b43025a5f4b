#include "runtime/kernels/cuda/device_memory.h"

#include <catch2/catch.hpp>

#include "runtime/kernels/cuda/test_util.h"

namespace dynapipe::runtime::cuda {
namespace {

using testing::Gate;
using testing::Stream;

TEST_CASE("device blocks come back per stream and wait for other streams' use", "[gpu]") {
  CudaAllocator alloc;
  CudaEventFences fences;
  Stream compute, comm;
  {
    BufferPool pool(&alloc, &fences);
    void* sent = nullptr;
    Gate gate;
    {
      Buffer a = *pool.Get(1 << 20, Handle(compute.get()));
      CUDA_REQUIRE(cudaMemsetAsync(a.data(), 1, a.bytes(), compute.get()));
      sent = a.data();
      // The send on the comm stream is held back by the gate.
      gate.Block(comm.get());
      CUDA_REQUIRE(cudaMemsetAsync(a.data(), 2, a.bytes(), comm.get()));
      a.RecordUse(Handle(comm.get()));
    }
    CHECK(pool.stats().pending_bytes == BufferPool::SizeClass(1 << 20));
    {
      Buffer b = *pool.Get(1 << 20, Handle(compute.get()));
      CHECK(b.data() != sent);  // the comm stream has not used it yet
    }
    gate.Open();
    comm.Sync();
    Buffer c = *pool.Get(1 << 20, Handle(compute.get()));
    Buffer d = *pool.Get(1 << 20, Handle(compute.get()));
    CHECK((c.data() == sent || d.data() == sent));
    CHECK(pool.stats().misses == 2);
    CHECK(pool.stats().pending_bytes == 0);
    CHECK(fences.events_created() == 1);
  }
  CUDA_REQUIRE(cudaDeviceSynchronize());
}

TEST_CASE("a fence behind a stuck stream times out instead of blocking the host", "[gpu]") {
  CudaEventFences fences;
  Stream comm;
  Gate gate;
  gate.Block(comm.get());
  const StreamFences::Fence f = fences.Record(Handle(comm.get()));
  const absl::Time t0 = absl::Now();
  CHECK_FALSE(fences.WaitUntil(f, t0 + absl::Milliseconds(50)));
  CHECK(absl::Now() - t0 < absl::Seconds(5));
  gate.Open();
  CHECK(fences.WaitUntil(f, absl::Now() + absl::Seconds(60)));
  fences.Release(f);
}

TEST_CASE("an impossible device allocation returns null instead of breaking the context", "[gpu]") {
  CudaAllocator alloc;
  CHECK(alloc.Allocate(size_t{1} << 52) == nullptr);
  void* p = alloc.Allocate(4096);  // the context still works
  REQUIRE(p != nullptr);
  alloc.Free(p, 4096);
  CUDA_REQUIRE(cudaGetLastError());
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
