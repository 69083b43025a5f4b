#include "runtime/memory/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime {
namespace {

class HostAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
  void Free(void* ptr, size_t) override { std::free(ptr); }
};

constexpr size_t kMinBlock = 256;

}  // namespace

Allocator* CpuAllocator() {
  static HostAllocator allocator;
  return &allocator;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    block_ = std::exchange(other.block_, 0);
  }
  return *this;
}

void Buffer::Release() {
  if (data_ != nullptr) pool_->Put(data_, bytes_, block_);
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = block_ = 0;
}

size_t BufferPool::SizeClass(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  // Classes 2^k * {4, 5, 6, 7} / 4.
  const int k = std::bit_width(bytes - 1) - 1;  // 2^k < bytes <= 2^(k+1)
  const size_t quarter = size_t{1} << (k - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

BufferPool::~BufferPool() {
  Trim();
  MutexLock l(&mu_);
  if (stats_.in_use_bytes != 0) spdlog::error("buffer pool destroyed with {} bytes still in use", stats_.in_use_bytes);
}

Buffer BufferPool::Get(size_t bytes) {
  Buffer b;
  if (bytes == 0) return b;
  const size_t block = SizeClass(bytes);
  void* data = nullptr;
  {
    MutexLock l(&mu_);
    auto it = cache_.find(block);
    if (it != cache_.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
      ++stats_.hits;
    } else {
      ++stats_.misses;
      stats_.reserved_bytes += block;
      stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    }
    stats_.in_use_bytes += bytes;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  if (data == nullptr) {
    data = allocator_->Allocate(block);
    if (data == nullptr) {
      Trim();  // cached blocks of other classes may make room
      data = allocator_->Allocate(block);
    }
    DP_CHECK_MSG(data != nullptr, "out of memory allocating a pool block");
  }
  b.pool_ = this;
  b.data_ = data;
  b.bytes_ = bytes;
  b.block_ = block;
  return b;
}

void BufferPool::Put(void* data, size_t requested, size_t block) {
  MutexLock l(&mu_);
  stats_.in_use_bytes -= requested;
  cache_[block].push_back(data);
}

PoolStats BufferPool::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

void BufferPool::ResetPeak() {
  MutexLock l(&mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void BufferPool::Trim() {
  std::map<size_t, std::vector<void*>> cache;
  {
    MutexLock l(&mu_);
    cache.swap(cache_);
    for (const auto& [block, blocks] : cache) stats_.reserved_bytes -= block * blocks.size();
  }
  for (const auto& [block, blocks] : cache) {
    for (void* p : blocks) allocator_->Free(p, block);
  }
}

}  // namespace dynapipe::runtime
