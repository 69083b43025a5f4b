#include "runtime/kernels/cuda/device_memory.h"

#include <algorithm>

#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::cuda {

void* CudaAllocator::Allocate(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear it: out of memory is an answer, not a broken context
    return nullptr;
  }
  if (err != cudaSuccess) {
    spdlog::error("cudaMalloc({} bytes): {}", bytes, cudaGetErrorString(err));
    return nullptr;
  }
  return ptr;
}

void CudaAllocator::Free(void* ptr, size_t bytes) {
  if (const cudaError_t err = cudaFree(ptr); err != cudaSuccess) {
    spdlog::error("cudaFree({} bytes): {}", bytes, cudaGetErrorString(err));
  }
}

CudaEventFences::~CudaEventFences() {
  MutexLock l(&mu_);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  if (free_.size() != created_) {
    spdlog::error("{} CUDA fence(s) still held when their owner was destroyed", created_ - free_.size());
  }
}

StreamFences::Fence CudaEventFences::Record(StreamHandle stream) {
  cudaEvent_t e = nullptr;
  {
    MutexLock l(&mu_);
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    }
  }
  if (e == nullptr) {
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    DP_CHECK_MSG(err == cudaSuccess, std::string("cudaEventCreateWithFlags: ") + cudaGetErrorString(err));
    MutexLock l(&mu_);
    ++created_;
  }
  const cudaError_t err = cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream));
  DP_CHECK_MSG(err == cudaSuccess, std::string("cudaEventRecord: ") + cudaGetErrorString(err));
  return reinterpret_cast<Fence>(e);
}

bool CudaEventFences::Passed(Fence fence) {
  const cudaError_t err = cudaEventQuery(reinterpret_cast<cudaEvent_t>(fence));
  if (err == cudaErrorNotReady) return false;
  if (err != cudaSuccess) spdlog::error("cudaEventQuery: {}", cudaGetErrorString(err));
  return true;
}

bool CudaEventFences::WaitUntil(Fence fence, absl::Time deadline) {
  absl::Duration nap = absl::Microseconds(50);
  while (!Passed(fence)) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
  return true;
}

void CudaEventFences::Release(Fence fence) {
  MutexLock l(&mu_);
  free_.push_back(reinterpret_cast<cudaEvent_t>(fence));
}

size_t CudaEventFences::events_created() const {
  MutexLock l(&mu_);
  return created_;
}

}  // namespace dynapipe::runtime::cuda
