#pragma once

// Memory for activations, received tensors and gradients. Shapes change every
// iteration (dynamic micro-batches), so exact-size caching would miss almost
// always; the pool rounds requests up to size classes four per power of two
// (at most 25% slack) and keeps freed blocks per class for reuse. In-use,
// block and reserved bytes and their peaks are measured for the iteration
// report (fragmentation = what is reserved but not requested).
//
// Where the allocator can give back the tail of a live block (host memory:
// its pages), a request of a page or more is served from the smallest
// cached block up to kReuseUpTo times its class before new memory is
// obtained: on the CPU, with every class kept apart, a training run's pool
// reserved 600-700 MB while 20-45 MB were in use at once, and faulting its
// fresh pages in took 7-10% of the run's CPU time (`perf`, 2026-11-29).
// Such a buffer holds more than its class, which returning the cache does
// not give back; so when memory runs out the tails of live larger blocks go
// back too, and the pool then needs no more than one of exact classes.
//
// Device memory is stream-ordered: a kernel queued on a stream may still use
// a buffer after the host released it. A freed block therefore returns to the
// cache of the stream it was allocated on, where later work is ordered after
// the earlier use, and is never handed to another stream. A buffer that was
// also used on other streams (a communication stream sending it, say) is
// released with a fence on each of those streams (Buffer::RecordUse) and only
// becomes reusable once the fences have passed. The allocator and the fences
// are the device-specific parts: the CPU uses host memory and stream 0 (no
// fences), the CUDA backend plugs in cudaMalloc and CUDA events.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/mutex.h"

namespace dynapipe::runtime {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Null when the memory is not available.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  // What bounds this allocator, for an out-of-memory message ("" if only the
  // memory underneath).
  virtual std::string Bound() const { return {}; }
  // Whether Shrink gives memory back.
  virtual bool CanShrink() const { return false; }
  // Gives back what a live block of `bytes` holds past its first `keep`
  // bytes (whose contents stay); the block is then `keep` bytes, to Free
  // too. Only where CanShrink().
  virtual void Shrink(void* /*ptr*/, size_t /*bytes*/, size_t /*keep*/) {}
};

// 64-byte aligned host memory.
Allocator* CpuAllocator();

// `base` with a budget: Allocate returns null once the bytes it handed out
// and not yet freed would pass the budget (0 = no budget). A CPU rank's
// device memory: the host has no per-rank memory to run out of, so without
// it a plan that outgrows its modelled device would take the host's memory
// from every process on it. Thread-safe.
class BudgetAllocator final : public Allocator {
 public:
  explicit BudgetAllocator(Allocator* base) : base_(base) {}
  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  std::string Bound() const override;
  bool CanShrink() const override { return base_->CanShrink(); }
  void Shrink(void* ptr, size_t bytes, size_t keep) override;
  // `what` says where the budget comes from, for Bound().
  void SetBudget(size_t bytes, std::string what);
  size_t allocated() const;

 private:
  Allocator* base_;
  mutable Mutex mu_;
  size_t budget_ ABSL_GUARDED_BY(mu_) = 0;
  size_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  std::string what_ ABSL_GUARDED_BY(mu_);
};

// An opaque stream (a cudaStream_t on CUDA); 0 is the host, whose work is
// complete when the call that queued it returns.
using StreamHandle = uintptr_t;

// Fences in a device's streams. Thread-safe.
class StreamFences {
 public:
  using Fence = uintptr_t;
  virtual ~StreamFences() = default;
  // A fence after the work queued on `stream` so far.
  virtual Fence Record(StreamHandle stream) = 0;
  // Whether the work before `fence` has finished (does not block).
  virtual bool Passed(Fence fence) = 0;
  // Blocks until the work before `fence` has finished or `deadline` passed;
  // false in the second case.
  virtual bool WaitUntil(Fence fence, absl::Time deadline) = 0;
  // The fence is no longer needed.
  virtual void Release(Fence fence) = 0;
};

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
  // The stream the buffer was allocated for.
  StreamHandle stream() const { return stream_; }
  // Declares that work on `other` uses the buffer too: on release the block
  // is reused only after that work (a fence on `other`). No-op for the
  // allocation stream.
  void RecordUse(StreamHandle other);
  void Release();

 private:
  friend class BufferPool;
  BufferPool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t block_ = 0;  // the request's size class (the pool knows a larger block held)
  StreamHandle stream_ = 0;
  std::vector<StreamHandle> other_streams_;
};

struct PoolStats {
  size_t in_use_bytes = 0;     // requested bytes of live buffers
  size_t peak_in_use_bytes = 0;
  size_t block_bytes = 0;      // bytes the blocks of live buffers hold (>= in use)
  // Their requests' size classes (<= block bytes): what a pool of exact
  // classes holds for them, the least the device must have at once.
  size_t class_bytes = 0;
  size_t peak_class_bytes = 0;
  size_t reserved_bytes = 0;   // obtained from the allocator (live + cached + pending)
  size_t peak_reserved_bytes = 0;
  size_t pending_bytes = 0;    // released, waiting for fences on other streams
  int64_t hits = 0;            // requests served from the cache
  int64_t misses = 0;
  int64_t trims = 0;           // times the cache was returned to the allocator to make room
  int64_t larger_hits = 0;     // hits served by a block of a larger class
  int64_t sheds = 0;           // tails of live larger blocks given back to make room

  // Share of the peak reservation that was never requested: size-class
  // rounding, blocks cached for other sizes or streams, pending blocks.
  double Fragmentation() const {
    return peak_reserved_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(peak_in_use_bytes) / peak_reserved_bytes;
  }
};

class BufferPool {
 public:
  // `fences` may be null where every stream is the host (CPU).
  // `fence_timeout` bounds every wait for a fence (a hung device).
  explicit BufferPool(Allocator* allocator, StreamFences* fences = nullptr,
                      absl::Duration fence_timeout = absl::Minutes(1))
      : allocator_(allocator), fences_(fences), fence_timeout_(fence_timeout),
        reuse_larger_(allocator->CanShrink()) {}
  // Waits (bounded) for pending fences, then returns every cached block; a
  // block whose fence never passes is leaked with an error logged.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of at least `bytes` (uninitialised) for work on `stream`; empty
  // for 0 bytes. When the allocator fails, the cache (of every stream) is
  // returned to it and the allocation retried. RESOURCE_EXHAUSTED with the
  // pool's figures if it still fails (the planner's memory model was wrong),
  // DEADLINE_EXCEEDED if a pending block's fence did not pass within the
  // fence timeout: the caller fails its work, the process goes on.
  absl::StatusOr<Buffer> Get(size_t bytes, StreamHandle stream = 0);
  // The size class `bytes` is rounded up to.
  static size_t SizeClass(size_t bytes);
  // How much larger than its class a cached block serving a request may be
  // (where the allocator can shrink; 4 and 16 read alike on the CPU).
  static constexpr size_t kReuseUpTo = 4;
  // Requests below this are served from their own class only: a tail
  // smaller than a page gives nothing back.
  static constexpr size_t kReuseFrom = 4096;

  PoolStats stats() const;
  // Starts a new peak measurement (e.g. per iteration) from current usage.
  void ResetPeak();
  // Returns cached blocks to the allocator; with `wait_pending`, first waits
  // for the fences of pending blocks (each until the fence timeout) and
  // returns those too. DEADLINE_EXCEEDED when a fence did not pass: that
  // block stays pending.
  absl::Status Trim(bool wait_pending = false);

 private:
  friend class Buffer;
  struct Pending {
    void* data;
    size_t block;
    StreamHandle stream;
    std::vector<StreamFences::Fence> fences;
  };
  void Put(Buffer* b);
  // Moves pending blocks whose fences have all passed into the cache.
  void CollectPassed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdatePeaks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back the tails of live larger blocks; whether there were any.
  bool ShedLarger();

  Allocator* allocator_;
  StreamFences* fences_;
  absl::Duration fence_timeout_;
  const bool reuse_larger_;  // the allocator can shrink
  mutable Mutex mu_;
  // (stream, bytes held: a size class) -> free blocks.
  std::map<std::pair<StreamHandle, size_t>, std::vector<void*>> cache_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Live buffers served by a block larger than their class: data -> the
  // bytes held and the class.
  struct Larger {
    size_t held, block;
  };
  std::map<void*, Larger> larger_ ABSL_GUARDED_BY(mu_);
  PoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::runtime
