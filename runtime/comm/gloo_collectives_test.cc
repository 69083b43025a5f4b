// The Gloo communicator's collectives: all-reduce over the world and over
// groups, and started reduce-scatter / all-gather (gloo_collectives.cc).
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "runtime/comm/gloo_comm.h"
#include "runtime/comm/gloo_test_support.h"
#include "runtime/comm/kv_store.h"

namespace dynapipe::runtime::comm {
namespace {

using testing::Comms;
using testing::Connect;
using testing::Contains;
using testing::OnRanks;
using testing::Options;
using testing::Pattern;

TEST_CASE(
    "AllReduceSum sums over the world and over two disjoint groups at once, float and double") {
  MemoryKeyValueStore store;
  const int n = 4;
  Comms comms = Connect(n, &store);
  const size_t kWorld = 1001;  // not a multiple of 4: uneven chunks
  const size_t kSmall = 3;     // fewer elements than ranks: an empty chunk
  const size_t kGroup = 100000;

  struct Result {
    std::vector<absl::Status> statuses;
    std::vector<float> world_float, small, group;
    std::vector<double> world_double;
  };
  std::vector<Result> results(n);
  OnRanks(n, [&](int r) {
    Result& result = results[r];
    Communicator& comm = *comms[r];
    const std::vector<int> world = {0, 1, 2, 3};
    const absl::Time deadline = absl::Now() + absl::Seconds(10);

    result.world_float.resize(kWorld);
    result.world_double.resize(kWorld);
    for (size_t i = 0; i < kWorld; ++i) {
      result.world_float[i] = static_cast<float>(r * 1000 + i);  // exact sums
      result.world_double[i] = 0.1 * (r + 1) * (i + 1);          // rounding: order shows
    }
    result.statuses.push_back(
        comm.AllReduceSum(world, result.world_float.data(), kWorld, deadline));
    result.statuses.push_back(
        comm.AllReduceSum(world, result.world_double.data(), kWorld, deadline));
    result.small = {1.0f * r, 2.0f * r, 3.0f * r};
    result.statuses.push_back(comm.AllReduceSum(world, result.small.data(), kSmall, deadline));

    // {0,2} (listed out of order) and {1,3} at the same time, three rounds.
    const std::vector<int> group = r % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{1, 3};
    result.group.assign(kGroup, 0.0f);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> contribution(kGroup);
      for (size_t i = 0; i < kGroup; ++i)
        contribution[i] = static_cast<float>((r + 1) * (round + 1) + i % 7);
      result.statuses.push_back(comm.AllReduceSum(group, contribution.data(), kGroup, deadline));
      for (size_t i = 0; i < kGroup; ++i) result.group[i] += contribution[i];
    }
  });

  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const Result& result = results[r];
    for (const absl::Status& status : result.statuses) {
      INFO(status);
      CHECK(status.ok());
    }
    for (size_t i = 0; i < kWorld; ++i) {
      INFO("element " << i);
      REQUIRE(result.world_float[i] == static_cast<float>(4 * i + 6000));
      REQUIRE(result.world_double[i] == Approx(0.1 * 10 * (i + 1)).epsilon(1e-12));
    }
    // One rank sums each element and the others copy it.
    CHECK(result.world_double == results[0].world_double);
    CHECK(result.small == std::vector<float>{6.0f, 12.0f, 18.0f});
    const int a = r % 2 == 0 ? 0 : 1;  // the group's members are a and a + 2
    for (size_t i = 0; i < kGroup; ++i) {
      INFO("group element " << i);
      float expected = 0.0f;
      for (int round = 0; round < 3; ++round) {
        expected +=
            static_cast<float>((a + 1) * (round + 1) + i % 7 + (a + 3) * (round + 1) + i % 7);
      }
      REQUIRE(result.group[i] == expected);
    }
  }
}

TEST_CASE("AllReduceSum rejects bad groups and needs no peers for a group of one") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  float x[2] = {1.5f, 2.5f};
  CHECK(absl::IsInvalidArgument(comms[0]->AllReduceSum(std::vector<int>{1}, x, 2, deadline)));
  CHECK(absl::IsInvalidArgument(comms[0]->AllReduceSum(std::vector<int>{0, 0}, x, 2, deadline)));
  CHECK(absl::IsInvalidArgument(comms[0]->AllReduceSum(std::vector<int>{0, 5}, x, 2, deadline)));
  CHECK(absl::IsInvalidArgument(comms[0]->AllReduceSum(std::vector<int>{}, x, 2, deadline)));
  CHECK(absl::IsInvalidArgument(
      comms[0]->AllReduceSum(std::vector<int>{0, 1}, static_cast<float*>(nullptr), 2, deadline)));
  REQUIRE(comms[0]->AllReduceSum(std::vector<int>{0}, x, 2, deadline).ok());
  CHECK(x[0] == 1.5f);
  CHECK(x[1] == 2.5f);
}

// Values whose float sums round differently in different orders.
std::vector<float> Noisy(size_t n, int rank) {
  std::vector<float> v(n);
  uint32_t x = 2654435761u * static_cast<uint32_t>(rank + 1);
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x)) * 1e-9f * (1 + rank);
  }
  return v;
}

TEST_CASE("Started collectives: reduce-scatter then all-gather equals the all-reduce bit for bit, in any buckets") {
  MemoryKeyValueStore store;
  const int n = 3;  // three members: the order of a sum shows in its bits
  Comms comms = Connect(n, &store);
  const size_t kLen = 1000;  // not a multiple of 3
  const size_t kBuckets[] = {0, 17, 500, 999, 1000};
  struct Result {
    std::vector<absl::Status> statuses;
    std::vector<float> whole, bucketed, scattered;
  };
  std::vector<Result> results(n);
  OnRanks(n, [&](int r) {
    Result& out = results[r];
    Communicator& comm = *comms[r];
    const std::vector<int> world = {0, 1, 2};
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    out.whole = out.bucketed = out.scattered = Noisy(kLen, r);
    out.statuses.push_back(comm.AllReduceSum(world, out.whole.data(), kLen, deadline));
    // Buckets of uneven sizes, all started before any is waited on.
    std::vector<std::unique_ptr<Request>> pending;
    for (size_t b = 0; b + 1 < std::size(kBuckets); ++b) {
      auto req = comm.StartAllReduceSum(world, out.bucketed.data() + kBuckets[b], kBuckets[b + 1] - kBuckets[b],
                                        deadline);
      out.statuses.push_back(req.status());
      if (req.ok()) pending.push_back(*std::move(req));
    }
    for (auto& req : pending) out.statuses.push_back(req->Wait(deadline));
    // Uneven shards, one of them empty: member 0 owns [0, 600), 1 none, 2 [600, 1000).
    const std::vector<size_t> counts = {600, 0, 400};
    const size_t starts[] = {0, 600, 600, 1000};
    auto rs = comm.StartReduceScatterSum(world, out.scattered.data(), counts, deadline);
    out.statuses.push_back(rs.status());
    if (rs.ok()) out.statuses.push_back((*rs)->Wait(deadline));
    // Only this member's shard is the sum: overwrite the rest, the gather restores it.
    for (size_t i = 0; i < kLen; ++i) {
      if (i < starts[r] || i >= starts[r + 1]) out.scattered[i] = -1.0f;
    }
    auto ag = comm.StartAllGather(world, out.scattered.data(), counts, deadline);
    out.statuses.push_back(ag.status());
    if (ag.ok()) out.statuses.push_back((*ag)->Wait(deadline));
    // Counts that do not name every member are refused.
    out.statuses.push_back(absl::IsInvalidArgument(
                               comm.StartAllGather(world, out.scattered.data(), std::vector<size_t>{1, 2}, deadline)
                                   .status())
                               ? absl::OkStatus()
                               : absl::InternalError("two counts for three members were accepted"));
  });
  std::vector<float> expected(kLen, 0.0f);
  for (int k = 0; k < n; ++k) {
    const std::vector<float> v = Noisy(kLen, k);
    for (size_t i = 0; i < kLen; ++i) expected[i] = k == 0 ? v[i] : expected[i] + v[i];  // member order
  }
  CHECK(ShardBegin(kLen, n, 1) == 334);
  CHECK(ShardBegin(kLen, n, 3) == kLen);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    for (const absl::Status& s : results[r].statuses) {
      INFO(s);
      CHECK(s.ok());
    }
    CHECK(results[r].whole == expected);
    CHECK(results[r].bucketed == expected);
    CHECK(results[r].scattered == expected);
  }
}

TEST_CASE("A started collective runs while its rank computes, and one whose member never starts times out") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  const std::vector<int> both = {0, 1};
  std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 2.0f);
  // Rank 1 joins late; rank 0's Start returns at once and its wait ends once rank 1 has joined.
  const absl::Time start = absl::Now();
  auto req = comms[0]->StartAllReduceSum(both, a.data(), a.size(), start + absl::Seconds(10));
  REQUIRE(req.ok());
  CHECK(absl::Now() - start < absl::Milliseconds(100));
  absl::Status late_status;  // checked on this thread: Catch2 is not thread-safe
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    late_status = comms[1]->AllReduceSum(both, b.data(), b.size(), absl::Now() + absl::Seconds(10));
  });
  CHECK((*req)->Wait(absl::Now() + absl::Seconds(10)).ok());
  late.join();
  CHECK(late_status.ok());
  CHECK(absl::Now() - start >= absl::Milliseconds(300));
  CHECK(a[12345] == 3.0f);
  CHECK(b[12345] == 3.0f);

  // Nobody joins this one: the wait ends at its deadline, names the
  // collective, and aborts the communicator.
  auto lonely = comms[0]->StartAllReduceSum(both, a.data(), a.size(), absl::Now() + absl::Seconds(30));
  REQUIRE(lonely.ok());
  const absl::Time wait_start = absl::Now();
  const absl::Status status = (*lonely)->Wait(wait_start + absl::Milliseconds(300));
  INFO(status);
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(Contains(status, "all-reduce of 65536 floats over ranks {0,1}"));
  CHECK(absl::Now() - wait_start < absl::Seconds(5));
  CHECK(absl::IsAborted(comms[0]->Send(1, 1, a.data(), 4).status()));
}

TEST_CASE("Destroying a communicator with a collective still running ends it at once, not at its deadline") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  std::vector<float> a(1024, 1.0f);
  // Rank 1 never joins; the collective waits on it with a 30 s deadline.
  auto req = comms[0]->StartAllReduceSum(std::vector<int>{0, 1}, a.data(), a.size(), absl::Now() + absl::Seconds(30));
  REQUIRE(req.ok());
  absl::SleepFor(absl::Milliseconds(200));  // it is running now
  const absl::Time start = absl::Now();
  comms[0].reset();
  CHECK(absl::Now() - start < absl::Seconds(5));
  const absl::Status status = (*req)->Wait(absl::Now() + absl::Seconds(5));
  INFO(status);
  CHECK(absl::IsAborted(status));
}

}  // namespace
}  // namespace dynapipe::runtime::comm
