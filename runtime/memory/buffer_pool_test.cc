#include "runtime/memory/buffer_pool.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>

namespace dynapipe::runtime {
namespace {

// Counts what reaches the underlying allocator.
class CountingAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    if (capacity > 0 && live + bytes > capacity) return nullptr;
    ++allocations;
    live += bytes;
    return CpuAllocator()->Allocate(bytes);
  }
  void Free(void* p, size_t bytes) override {
    live -= bytes;
    CpuAllocator()->Free(p, bytes);
  }
  bool CanShrink() const override { return shrinkable; }
  void Shrink(void* p, size_t bytes, size_t keep) override {
    live -= bytes - keep;
    CpuAllocator()->Shrink(p, bytes, keep);
  }
  int allocations = 0;
  size_t live = 0;
  size_t capacity = 0;  // 0: unlimited
  bool shrinkable = false;
};

// Fences a test completes by hand: fence i passes once `passed_upto` > i.
class ManualFences final : public StreamFences {
 public:
  Fence Record(StreamHandle stream) override {
    recorded.push_back(stream);
    return recorded.size() - 1;
  }
  bool Passed(Fence f) override { return f < passed_upto; }
  bool WaitUntil(Fence f, absl::Time) override {
    ++waits;
    if (stuck) return false;
    passed_upto = std::max<size_t>(passed_upto, f + 1);
    return true;
  }
  void Release(Fence) override { ++released; }
  std::vector<StreamHandle> recorded;
  size_t passed_upto = 0;
  int waits = 0;
  int released = 0;
  bool stuck = false;  // a hung device: waits run out
};

constexpr StreamHandle kCompute = 11, kComm = 22;

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
      Buffer a = *pool.Get(1000), b = *pool.Get(5000), c = *pool.Get(100);
      std::memset(b.data(), 1, b.bytes());
      CHECK(pool.stats().in_use_bytes == 6100);
    }
    CHECK(pool.stats().in_use_bytes == 0);
    CHECK(pool.stats().peak_in_use_bytes == 6100);
    CHECK(alloc.allocations == 3);
    pool.ResetPeak();
    // "Iteration" 2: different sizes in the same classes come from the cache.
    {
      Buffer a = *pool.Get(900), b = *pool.Get(4700);
      CHECK(pool.stats().hits == 2);
      CHECK(pool.stats().peak_in_use_bytes == 5600);
      Buffer moved = std::move(a);
      CHECK(a.empty());
      CHECK(!moved.empty());
    }
    CHECK(alloc.allocations == 3);
    CHECK(pool.stats().reserved_bytes == alloc.live);
    REQUIRE(pool.Trim().ok());
    CHECK(alloc.live == 0);
    CHECK(pool.stats().reserved_bytes == 0);
  }
}

TEST_CASE("a freed block is reused only by its own stream", "[memory]") {
  CountingAllocator alloc;
  ManualFences fences;
  BufferPool pool(&alloc, &fences);
  void* first = nullptr;
  {
    Buffer a = *pool.Get(1000, kCompute);
    CHECK(a.stream() == kCompute);
    first = a.data();
  }
  {
    // Another stream could still be running kernels that read the block.
    Buffer b = *pool.Get(1000, kComm);
    CHECK(b.data() != first);
    CHECK(pool.stats().misses == 2);
  }
  Buffer c = *pool.Get(1000, kCompute);
  CHECK(c.data() == first);
  CHECK(pool.stats().hits == 1);
  CHECK(fences.recorded.empty());  // same-stream reuse needs no fence
}

TEST_CASE("a block used on another stream is reused once that stream's fence has passed", "[memory]") {
  CountingAllocator alloc;
  ManualFences fences;
  BufferPool pool(&alloc, &fences);
  void* sent = nullptr;
  {
    Buffer a = *pool.Get(4096, kCompute);
    sent = a.data();
    a.RecordUse(kComm);  // e.g. a pipeline send reads it on the comm stream
    a.RecordUse(kComm);
    a.RecordUse(kCompute);  // its own stream: nothing to record
  }
  REQUIRE(fences.recorded == std::vector<StreamHandle>{kComm});
  CHECK(pool.stats().pending_bytes == 4096);
  {
    Buffer b = *pool.Get(4096, kCompute);  // the send may still be reading `sent`
    CHECK(b.data() != sent);
  }
  fences.passed_upto = 1;
  Buffer c = *pool.Get(4096, kCompute);
  Buffer d = *pool.Get(4096, kCompute);
  CHECK((c.data() == sent || d.data() == sent));  // both cached blocks are reused, no new allocation
  CHECK(alloc.allocations == 2);
  CHECK(fences.released == 1);
  CHECK(pool.stats().pending_bytes == 0);
  CHECK(pool.stats().reserved_bytes == 2 * 4096);
}

TEST_CASE("destroying the pool waits for pending fences before freeing", "[memory]") {
  CountingAllocator alloc;
  ManualFences fences;
  {
    BufferPool pool(&alloc, &fences);
    Buffer a = *pool.Get(300, kCompute);
    a.RecordUse(kComm);
    a.Release();
    CHECK(fences.waits == 0);
  }
  CHECK(fences.waits == 1);
  CHECK(fences.released == 1);
  CHECK(alloc.live == 0);
}

TEST_CASE("out of memory returns other streams' cached blocks and pending ones, then retries", "[memory]") {
  CountingAllocator alloc;
  alloc.capacity = 8192;
  ManualFences fences;
  BufferPool pool(&alloc, &fences);
  {
    Buffer a = *pool.Get(4096, kComm);
    Buffer b = *pool.Get(4096, kCompute);
    b.RecordUse(kComm);
  }
  CHECK(alloc.live == 8192);
  Buffer big = *pool.Get(8000, kCompute);  // a class of 8192: only fits after both blocks go back
  CHECK(!big.empty());
  CHECK(pool.stats().trims == 1);
  CHECK(fences.waits == 1);
  CHECK(alloc.live == 8192);
  CHECK(pool.stats().reserved_bytes == 8192);
}

TEST_CASE("block bytes and fragmentation account for size-class rounding and cached blocks", "[memory]") {
  CountingAllocator alloc;
  BufferPool pool(&alloc);
  {
    Buffer a = *pool.Get(1025);  // class 1280
    CHECK(pool.stats().block_bytes == 1280);
    CHECK(pool.stats().in_use_bytes == 1025);
  }
  pool.ResetPeak();
  Buffer b = *pool.Get(2000);  // class 2048; the 1280 block stays cached
  const PoolStats s = pool.stats();
  CHECK(s.block_bytes == 2048);
  CHECK(s.peak_reserved_bytes == 1280 + 2048);
  CHECK(s.Fragmentation() == Approx(1.0 - 2000.0 / (1280 + 2048)));
}


TEST_CASE("out of memory is an error the caller gets, not an abort; the pool stays usable", "[memory]") {
  CountingAllocator alloc;
  alloc.capacity = 8192;
  BufferPool pool(&alloc);
  Buffer a = *pool.Get(4096);
  absl::StatusOr<Buffer> big = pool.Get(8000);
  REQUIRE(!big.ok());
  CHECK(big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(big.status().message().find("out of memory") != std::string::npos);
  // The failed request left the figures as they were.
  CHECK(pool.stats().in_use_bytes == 4096);
  CHECK(pool.stats().reserved_bytes == 4096);
  a.Release();
  absl::StatusOr<Buffer> again = pool.Get(8000);  // the cached 4096 block goes back first
  REQUIRE(again.ok());
  CHECK(pool.stats().reserved_bytes == 8192);
}

TEST_CASE("a budget bounds what the pool obtains; the error names it; a new budget starts from what is held",
          "[memory]") {
  CountingAllocator host;
  BudgetAllocator budget(&host);
  budget.SetBudget(8192, "memory_limit_mb 1 less 1016 KiB of model state");
  BufferPool pool(&budget);
  Buffer a = *pool.Get(4096);
  CHECK(budget.allocated() == 4096);
  absl::StatusOr<Buffer> big = pool.Get(6000);  // 6144 more would pass 8192
  REQUIRE(!big.ok());
  CHECK(big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(big.status().message().find("limit 0.0 MiB for buffers (memory_limit_mb 1 less 1016 KiB of model state)") !=
        std::string::npos);
  CHECK(host.live == 4096);  // the refused block never reached the host
  a.Release();
  REQUIRE(pool.Get(6000).ok());  // the cached block went back to make room
  CHECK(budget.allocated() == 6144);
  budget.SetBudget(0, "");  // no budget
  Buffer huge = *pool.Get(1 << 20);
  CHECK(budget.allocated() == 6144 + (1 << 20));
  CHECK(budget.Bound().empty());
}

TEST_CASE("where blocks can shrink, a cached block up to 4x a request's class serves it, from a page up",
          "[memory]") {
  for (const bool shrinkable : {false, true}) {
    CAPTURE(shrinkable);
    CountingAllocator alloc;
    alloc.shrinkable = shrinkable;
    BufferPool pool(&alloc);
    void* big = pool.Get(64 << 10)->data();  // released at once: cached
    // Class 12,288: the cached 64 KiB is over 4x it.
    CHECK(pool.Get(12000)->data() != big);
    CHECK(alloc.allocations == 2);
    {
      Buffer mid = *pool.Get(20000);  // class 20,480: 64 KiB is within 4x
      CHECK((mid.data() == big) == shrinkable);
      CHECK(pool.stats().block_bytes == (shrinkable ? 64u << 10 : 20480u));
      CHECK(pool.stats().larger_hits == (shrinkable ? 1 : 0));
    }
    // Released, the block goes back under what it holds and serves its own class.
    CHECK(pool.Get(64 << 10)->data() == big);
    // Below a page only the request's own class serves: a 1,024-byte class
    // is not taken from the cached 1,280-byte one, whatever the allocator.
    void* small = pool.Get(1280)->data();
    CHECK(pool.Get(1000)->data() != small);
    CHECK(pool.stats().block_bytes == 0);
  }
}

TEST_CASE("out of memory gives back the tails of live larger blocks: no more is needed than with exact classes",
          "[memory]") {
  BudgetAllocator budget(CpuAllocator());
  budget.SetBudget(96 << 10, "a test's 96 KiB");
  BufferPool pool(&budget);
  void* big = pool.Get(64 << 10)->data();
  Buffer a = *pool.Get(20000);  // class 20,480, served by the cached 64 KiB
  REQUIRE(a.data() == big);
  std::memset(a.data(), 7, a.bytes());
  // Class 40,960: 64 KiB + 40 KiB would pass the budget; with a's block cut
  // to its class, 20 KiB + 40 KiB fit, as they would in a pool of exact classes.
  absl::StatusOr<Buffer> b = pool.Get(40000);
  INFO(b.status());
  REQUIRE(b.ok());
  PoolStats s = pool.stats();
  CHECK(s.sheds == 1);
  CHECK(s.block_bytes == 20480 + 40960);
  CHECK(s.reserved_bytes == 20480 + 40960);
  CHECK(budget.allocated() == 20480 + 40960);
  // What a buffer holds survives the cut.
  const auto* bytes = a.as<unsigned char>();
  CHECK(std::all_of(bytes, bytes + a.bytes(), [](unsigned char c) { return c == 7; }));
  // Released, the cut block counts as its class, no more.
  a.Release();
  b->Release();
  CHECK(pool.stats().block_bytes == 0);
  CHECK(pool.stats().reserved_bytes == 20480 + 40960);
  CHECK(pool.Get(20000)->data() == big);
  REQUIRE(pool.Trim().ok());
  CHECK(budget.allocated() == 0);
}

TEST_CASE("a fence that never passes bounds an out-of-memory retry instead of hanging", "[memory]") {
  CountingAllocator alloc;
  alloc.capacity = 8192;
  ManualFences fences;
  fences.stuck = true;
  {
    BufferPool pool(&alloc, &fences, absl::Milliseconds(10));
    {
      Buffer b = *pool.Get(4096, kCompute);
      b.RecordUse(kComm);  // pending on a fence of the comm stream that never passes
    }
    Buffer c = *pool.Get(4096, kCompute);
    absl::StatusOr<Buffer> big = pool.Get(8000, kCompute);
    REQUIRE(!big.ok());
    CHECK(big.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(big.status().message().find("did not pass") != std::string::npos);
    // The stuck block is still pending: never handed out while the device may use it.
    CHECK(pool.stats().pending_bytes == 4096);
  }
  // Destroying the pool leaked the stuck block rather than freeing memory in use.
  CHECK(alloc.live == 4096);

}

}  // namespace
}  // namespace dynapipe::runtime
