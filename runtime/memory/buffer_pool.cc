#include "runtime/memory/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime {
namespace {

class HostAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
  void Free(void* ptr, size_t) override { std::free(ptr); }
  bool CanShrink() const override { return true; }
  // The whole pages past `keep` go back to the system (a later touch maps a
  // fresh zero page); a part page stays. The block stays allocated, to free.
  void Shrink(void* ptr, size_t bytes, size_t keep) override {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t from = (reinterpret_cast<uintptr_t>(ptr) + keep + page - 1) / page * page;
    const uintptr_t to = (reinterpret_cast<uintptr_t>(ptr) + bytes) / page * page;
    if (to > from && madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED) != 0) {
      spdlog::warn("buffer pool: giving back {} bytes of a block failed: {}", to - from, std::strerror(errno));
    }
  }
};

constexpr size_t kMinBlock = 256;

}  // namespace

Allocator* CpuAllocator() {
  static HostAllocator allocator;
  return &allocator;
}

void* BudgetAllocator::Allocate(size_t bytes) {
  {
    MutexLock l(&mu_);
    if (budget_ != 0 && allocated_ + bytes > budget_) return nullptr;
    allocated_ += bytes;
  }
  void* p = base_->Allocate(bytes);
  if (p == nullptr) {
    MutexLock l(&mu_);
    allocated_ -= bytes;
  }
  return p;
}

void BudgetAllocator::Free(void* ptr, size_t bytes) {
  base_->Free(ptr, bytes);
  MutexLock l(&mu_);
  allocated_ -= bytes;
}

void BudgetAllocator::Shrink(void* ptr, size_t bytes, size_t keep) {
  base_->Shrink(ptr, bytes, keep);
  MutexLock l(&mu_);
  allocated_ -= bytes - keep;
}

std::string BudgetAllocator::Bound() const {
  MutexLock l(&mu_);
  if (budget_ == 0) return {};
  return absl::StrFormat("%.1f MiB for buffers (%s)", static_cast<double>(budget_) / (1 << 20), what_);
}

void BudgetAllocator::SetBudget(size_t bytes, std::string what) {
  MutexLock l(&mu_);
  budget_ = bytes;
  what_ = std::move(what);
}

size_t BudgetAllocator::allocated() const {
  MutexLock l(&mu_);
  return allocated_;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    block_ = std::exchange(other.block_, 0);
    stream_ = std::exchange(other.stream_, 0);
    other_streams_ = std::exchange(other.other_streams_, {});
  }
  return *this;
}

void Buffer::RecordUse(StreamHandle other) {
  if (data_ == nullptr || other == stream_) return;
  if (std::find(other_streams_.begin(), other_streams_.end(), other) == other_streams_.end()) {
    other_streams_.push_back(other);
  }
}

void Buffer::Release() {
  if (data_ != nullptr) pool_->Put(this);
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = block_ = 0;
  stream_ = 0;
  other_streams_.clear();
}

size_t BufferPool::SizeClass(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  // Classes 2^k * {4, 5, 6, 7} / 4.
  const int k = std::bit_width(bytes - 1) - 1;  // 2^k < bytes <= 2^(k+1)
  const size_t quarter = size_t{1} << (k - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

BufferPool::~BufferPool() {
  if (absl::Status s = Trim(/*wait_pending=*/true); !s.ok()) {
    spdlog::error("buffer pool: {} (its blocks are leaked, not reused)", s.message());
  }
  MutexLock l(&mu_);
  if (stats_.in_use_bytes != 0) spdlog::error("buffer pool destroyed with {} bytes still in use", stats_.in_use_bytes);
}

absl::StatusOr<Buffer> BufferPool::Get(size_t bytes, StreamHandle stream) {
  Buffer b;
  if (bytes == 0) return b;
  const size_t block = SizeClass(bytes);
  size_t held = block;
  void* data = nullptr;
  {
    MutexLock l(&mu_);
    if (!pending_.empty()) CollectPassed();
    // The smallest cached block of the class or, where tails can be given
    // back, of a larger one.
    const size_t largest = reuse_larger_ && block >= kReuseFrom ? block * kReuseUpTo : block;
    for (auto it = cache_.lower_bound({stream, block});
         it != cache_.end() && it->first.first == stream && it->first.second <= largest; ++it) {
      if (it->second.empty()) continue;
      data = it->second.back();
      it->second.pop_back();
      held = it->first.second;
      break;
    }
    if (data != nullptr) {
      ++stats_.hits;
      if (held != block) {
        ++stats_.larger_hits;
        larger_[data] = {held, block};
      }
    } else {
      ++stats_.misses;
      stats_.reserved_bytes += block;
    }
    stats_.in_use_bytes += bytes;
    stats_.block_bytes += held;
    stats_.class_bytes += block;
    // Peaks count a block once it is there (below for a miss), not a
    // request that then fails.
    if (data != nullptr) UpdatePeaks();
  }
  if (data == nullptr) {
    data = allocator_->Allocate(block);
    absl::Status trimmed;
    if (data == nullptr) {
      trimmed = Trim(/*wait_pending=*/true);  // cached blocks of other classes or streams may make room
      data = allocator_->Allocate(block);
    }
    if (data == nullptr && ShedLarger()) data = allocator_->Allocate(block);
    if (data == nullptr) {
      PoolStats s;
      {
        MutexLock l(&mu_);
        stats_.in_use_bytes -= bytes;
        stats_.block_bytes -= block;
        stats_.class_bytes -= block;
        stats_.reserved_bytes -= block;
        s = stats_;
      }
      const std::string bound = allocator_->Bound();
      const std::string what = absl::StrCat(
          "out of memory allocating a pool block of ", block, " bytes (", bytes, " requested; ", s.in_use_bytes,
          " in use, ", s.reserved_bytes, " reserved after returning the cache", bound.empty() ? "" : "; limit ",
          bound, ")");
      if (!trimmed.ok()) return absl::DeadlineExceededError(absl::StrCat(what, "; ", trimmed.message()));
      return absl::ResourceExhaustedError(what);
    }
    MutexLock l(&mu_);
    UpdatePeaks();
  }
  b.pool_ = this;
  b.data_ = data;
  b.bytes_ = bytes;
  b.block_ = block;
  b.stream_ = stream;
  return b;
}

void BufferPool::Put(Buffer* b) {
  MutexLock l(&mu_);
  size_t held = b->block_;
  if (auto it = larger_.find(b->data_); it != larger_.end()) {
    held = it->second.held;
    larger_.erase(it);
  }
  stats_.in_use_bytes -= b->bytes_;
  stats_.block_bytes -= held;
  stats_.class_bytes -= b->block_;
  if (b->other_streams_.empty() || fences_ == nullptr) {
    // Later work on the same stream is ordered after this buffer's last use.
    cache_[{b->stream_, held}].push_back(b->data_);
    return;
  }
  Pending p{b->data_, held, b->stream_, {}};
  p.fences.reserve(b->other_streams_.size());
  for (StreamHandle s : b->other_streams_) p.fences.push_back(fences_->Record(s));
  stats_.pending_bytes += held;
  pending_.push_back(std::move(p));
}

void BufferPool::CollectPassed() {
  auto passed = [this](Pending& p) {
    for (StreamFences::Fence f : p.fences) {
      if (!fences_->Passed(f)) return false;
    }
    for (StreamFences::Fence f : p.fences) fences_->Release(f);
    cache_[{p.stream, p.block}].push_back(p.data);
    stats_.pending_bytes -= p.block;
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), passed), pending_.end());
}

bool BufferPool::ShedLarger() {
  MutexLock l(&mu_);
  if (larger_.empty()) return false;
  for (const auto& [data, larger] : larger_) {
    allocator_->Shrink(data, larger.held, larger.block);
    stats_.block_bytes -= larger.held - larger.block;
    stats_.reserved_bytes -= larger.held - larger.block;
    ++stats_.sheds;
  }
  larger_.clear();  // each buffer now holds its class
  return true;
}

PoolStats BufferPool::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

void BufferPool::ResetPeak() {
  MutexLock l(&mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_class_bytes = stats_.class_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void BufferPool::UpdatePeaks() {
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  stats_.peak_class_bytes = std::max(stats_.peak_class_bytes, stats_.class_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

absl::Status BufferPool::Trim(bool wait_pending) {
  std::vector<std::pair<void*, size_t>> to_free;
  std::vector<Pending> waiting;
  {
    MutexLock l(&mu_);
    if (!pending_.empty()) CollectPassed();
    for (const auto& [key, blocks] : cache_) {
      for (void* p : blocks) to_free.emplace_back(p, key.second);
    }
    cache_.clear();
    if (wait_pending) {
      waiting.swap(pending_);
      for (const Pending& p : waiting) stats_.pending_bytes -= p.block;
    }
    for (const auto& [p, block] : to_free) stats_.reserved_bytes -= block;
    for (const Pending& p : waiting) stats_.reserved_bytes -= p.block;
    ++stats_.trims;
  }
  absl::Status status;
  std::vector<Pending> stuck;
  for (Pending& p : waiting) {
    const absl::Time deadline = absl::Now() + fence_timeout_;
    bool passed = true;
    for (StreamFences::Fence f : p.fences) passed = passed && fences_->WaitUntil(f, deadline);
    if (!passed) {
      status = absl::DeadlineExceededError(absl::StrCat("a device fence of a pending ", p.block,
                                                        "-byte pool block did not pass within ",
                                                        absl::FormatDuration(fence_timeout_)));
      stuck.push_back(std::move(p));
      continue;
    }
    for (StreamFences::Fence f : p.fences) fences_->Release(f);
    to_free.emplace_back(p.data, p.block);
  }
  for (const auto& [p, block] : to_free) allocator_->Free(p, block);
  if (!stuck.empty()) {
    // Back to pending: their memory may still be in use on the device.
    MutexLock l(&mu_);
    for (Pending& p : stuck) {
      stats_.pending_bytes += p.block;
      stats_.reserved_bytes += p.block;
      pending_.push_back(std::move(p));
    }
  }
  return status;
}

}  // namespace dynapipe::runtime
