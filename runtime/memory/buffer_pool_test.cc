#include "runtime/memory/buffer_pool.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace dynapipe::runtime {
namespace {

// Counts what reaches the underlying allocator.
class CountingAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    ++allocations;
    live += bytes;
    return CpuAllocator()->Allocate(bytes);
  }
  void Free(void* p, size_t bytes) override {
    live -= bytes;
    CpuAllocator()->Free(p, bytes);
  }
  int allocations = 0;
  size_t live = 0;
};

TEST_CASE("size classes are four per power of two and never smaller than the request", "[memory]") {
  CHECK(BufferPool::SizeClass(1) == 256);
  CHECK(BufferPool::SizeClass(1024) == 1024);
  CHECK(BufferPool::SizeClass(1025) == 1280);
  CHECK(BufferPool::SizeClass(1281) == 1536);
  CHECK(BufferPool::SizeClass(1793) == 2048);
  for (size_t b = 1; b < 100000; b = b * 3 / 2 + 1) {
    const size_t c = BufferPool::SizeClass(b);
    CHECK(c >= b);
    CHECK(c <= std::max<size_t>(256, b + b / 4 + 1));
  }
}

TEST_CASE("freed blocks are reused across varying shapes; peak tracks live bytes", "[memory]") {
  CountingAllocator alloc;
  {
    BufferPool pool(&alloc);
    // "Iteration" 1: three buffers live at once.
    {
      Buffer a = pool.Get(1000), b = pool.Get(5000), c = pool.Get(100);
      std::memset(b.data(), 1, b.bytes());
      CHECK(pool.stats().in_use_bytes == 6100);
    }
    CHECK(pool.stats().in_use_bytes == 0);
    CHECK(pool.stats().peak_in_use_bytes == 6100);
    CHECK(alloc.allocations == 3);
    pool.ResetPeak();
    // "Iteration" 2: different sizes in the same classes come from the cache.
    {
      Buffer a = pool.Get(900), b = pool.Get(4700);
      CHECK(pool.stats().hits == 2);
      CHECK(pool.stats().peak_in_use_bytes == 5600);
      Buffer moved = std::move(a);
      CHECK(a.empty());
      CHECK(!moved.empty());
    }
    CHECK(alloc.allocations == 3);
    CHECK(pool.stats().reserved_bytes == alloc.live);
    pool.Trim();
    CHECK(alloc.live == 0);
    CHECK(pool.stats().reserved_bytes == 0);
  }
}

}  // namespace
}  // namespace dynapipe::runtime
