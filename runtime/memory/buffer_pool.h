#pragma once

// Memory for activations, received tensors and gradients. Shapes change every
// iteration (dynamic micro-batches), so exact-size caching would miss almost
// always; the pool rounds requests up to size classes four per power of two
// (at most 25% slack) and keeps freed blocks per class for reuse. In-use and
// reserved bytes and their peaks are measured for the iteration report.
// The allocator is the only device-specific part: the CUDA backend plugs a
// cudaMalloc allocator into the same pool.

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "src/common/mutex.h"

namespace dynapipe::runtime {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Null when the memory is not available.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
};

// 64-byte aligned host memory.
Allocator* CpuAllocator();

class BufferPool;

// A block from the pool; returns to it when destroyed. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }  // as requested
  bool empty() const { return data_ == nullptr; }
  void Release();

 private:
  friend class BufferPool;
  BufferPool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t block_ = 0;  // size class actually held
};

struct PoolStats {
  size_t in_use_bytes = 0;     // requested bytes of live buffers
  size_t peak_in_use_bytes = 0;
  size_t reserved_bytes = 0;   // obtained from the allocator (live + cached)
  size_t peak_reserved_bytes = 0;
  int64_t hits = 0;            // requests served from the cache
  int64_t misses = 0;
};

class BufferPool {
 public:
  explicit BufferPool(Allocator* allocator) : allocator_(allocator) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of at least `bytes` (uninitialised); empty for 0 bytes. Aborts
  // with a message if the allocator fails even after the cache is dropped.
  Buffer Get(size_t bytes);
  // The size class `bytes` is rounded up to.
  static size_t SizeClass(size_t bytes);

  PoolStats stats() const;
  // Starts a new peak measurement (e.g. per iteration) from current usage.
  void ResetPeak();
  // Returns cached blocks to the allocator.
  void Trim();

 private:
  friend class Buffer;
  void Put(void* data, size_t requested, size_t block);

  Allocator* allocator_;
  mutable Mutex mu_;
  std::map<size_t, std::vector<void*>> cache_ ABSL_GUARDED_BY(mu_);
  PoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::runtime
