#pragma once

// Device memory for the buffer pool (runtime/memory/buffer_pool.h): a
// cudaMalloc allocator and CUDA-event fences, so the pool's size classes,
// per-stream caches and statistics are the same code on CPU and GPU.
// A pool over these is created once per executor and device:
//
//   CudaAllocator alloc;
//   CudaEventFences fences;
//   BufferPool pool(&alloc, &fences);
//   Buffer b = pool.Get(bytes, reinterpret_cast<StreamHandle>(compute_stream));

#include <cuda_runtime_api.h>

#include <vector>

#include "runtime/memory/buffer_pool.h"
#include "src/common/mutex.h"

namespace dynapipe::runtime::cuda {

inline StreamHandle Handle(cudaStream_t s) { return reinterpret_cast<StreamHandle>(s); }

// cudaMalloc / cudaFree on the calling thread's current device. Allocate
// returns null when the device is out of memory (the pool then returns its
// cache and retries).
class CudaAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
};

// Fences are CUDA events (timing disabled), recycled through a free list.
// A device error that makes a fence unqueryable counts as passed: the
// context is lost then, and waiting on it would never end.
class CudaEventFences final : public StreamFences {
 public:
  CudaEventFences() = default;
  ~CudaEventFences() override;
  CudaEventFences(const CudaEventFences&) = delete;
  CudaEventFences& operator=(const CudaEventFences&) = delete;

  Fence Record(StreamHandle stream) override;
  bool Passed(Fence fence) override;
  // Polls the event (sleeping 50 us .. 1 ms between polls) until it passes
  // or the deadline: a hung kernel must not hang the host.
  bool WaitUntil(Fence fence, absl::Time deadline) override;
  void Release(Fence fence) override;

  // Events created so far (live and free), for tests.
  size_t events_created() const;

 private:
  mutable Mutex mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
  size_t created_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dynapipe::runtime::cuda
