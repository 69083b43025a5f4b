#include "runtime/comm/staged_comm.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/comm/gloo_comm.h"
#include "runtime/comm/kv_store.h"

// Two ranks (threads) over Gloo on loopback, each wrapped as a "device"
// communicator whose copies are counted memcpys.

namespace dynapipe::runtime::comm {
namespace {

struct Copies {
  std::atomic<int> to_host{0}, from_host{0};
  bool fail_to_host = false;
  StagingCopies Make() {
    return {[this](void* h, const void* d, size_t n) -> absl::Status {
              if (fail_to_host) return absl::InternalError("device copy failed");
              ++to_host;
              std::memcpy(h, d, n);
              return absl::OkStatus();
            },
            [this](void* d, const void* h, size_t n) {
              ++from_host;
              std::memcpy(d, h, n);
              return absl::OkStatus();
            }};
  }
};

std::vector<std::unique_ptr<Communicator>> Connect(KeyValueStore* store, Copies* copies) {
  std::vector<std::unique_ptr<Communicator>> comms(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = CreateGlooCommunicator({.rank = r, .size = 2, .job_prefix = "staged/"}, store);
      if (c.ok()) comms[r] = HostStaged(std::move(*c), copies[r].Make());
    });
  }
  for (auto& t : threads) t.join();
  return comms;
}

TEST_CASE("host-staged transfers snapshot the sent bytes and land in the device buffer only at Wait", "[comm]") {
  MemoryKeyValueStore store;
  Copies copies[2];
  auto comms = Connect(&store, copies);
  REQUIRE((comms[0] && comms[1]));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::vector<float> sent(1000), got(1000, -1.0f);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<float>(i) * 0.5f;
  const std::vector<float> want = sent;
  auto recv = comms[1]->Recv(0, 7, got.data(), got.size() * sizeof(float));
  REQUIRE(recv.ok());
  auto send = comms[0]->Send(1, 7, sent.data(), sent.size() * sizeof(float));
  REQUIRE(send.ok());
  std::fill(sent.begin(), sent.end(), 9.0f);  // the device buffer is free once Send returned
  REQUIRE((*send)->Wait(deadline).ok());
  CHECK(copies[1].from_host == 0);
  REQUIRE((*recv)->Wait(deadline).ok());
  CHECK(got == want);
  CHECK(copies[0].to_host == 1);
  CHECK(copies[1].from_host == 1);
  CHECK((*recv)->Wait(deadline).ok());  // a second wait repeats the result, no second copy
  CHECK(copies[1].from_host == 1);

  // All-reduce: both ranks see the sum in their device buffers, identically.
  std::vector<float> a{1.5f, 2.0f, -3.0f}, b{0.25f, 4.0f, 3.0f};
  std::vector<double> da{1e-3, 7}, db{2e-3, 8};
  absl::Status sa, sb;
  std::thread t([&] {
    sb = comms[1]->AllReduceSum({0, 1}, b.data(), b.size(), deadline);
    if (sb.ok()) sb = comms[1]->AllReduceSum({0, 1}, db.data(), db.size(), deadline);
  });
  sa = comms[0]->AllReduceSum({0, 1}, a.data(), a.size(), deadline);
  if (sa.ok()) sa = comms[0]->AllReduceSum({0, 1}, da.data(), da.size(), deadline);
  t.join();
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  CHECK(a == std::vector<float>{1.75f, 6.0f, 0.0f});
  CHECK(a == b);
  CHECK(da == db);
  CHECK(da[1] == 15.0);
}

TEST_CASE("host-staged reduce-scatter and all-gather with uneven shards give an all-reduce's bits", "[comm]") {
  MemoryKeyValueStore store;
  Copies copies[2];
  auto comms = Connect(&store, copies);
  REQUIRE((comms[0] && comms[1]));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  // 7 values: rank 0 owns 3, rank 1 owns 4 (ZeRO-1's shards need not be even).
  const std::vector<size_t> counts = {3, 4};
  std::vector<float> data[2] = {{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f}, {1, 2, 3, 4, 5, 6, 7}};
  std::vector<float> want = data[0];
  for (size_t i = 0; i < want.size(); ++i) want[i] += data[1][i];
  absl::Status status[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto rs = comms[r]->StartReduceScatterSum({0, 1}, data[r].data(), counts, deadline);
      status[r] = rs.ok() ? (*rs)->Wait(deadline) : rs.status();
      if (!status[r].ok()) return;
      // Each rank keeps only its own shard's sum before the gather.
      const size_t lo = r == 0 ? 0 : 3, hi = r == 0 ? 3 : 7;
      for (size_t i = 0; i < data[r].size(); ++i) {
        if (i < lo || i >= hi) data[r][i] = -1.0f;
      }
      auto ag = comms[r]->StartAllGather({0, 1}, data[r].data(), counts, deadline);
      status[r] = ag.ok() ? (*ag)->Wait(deadline) : ag.status();
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(status[0].ok());
  REQUIRE(status[1].ok());
  CHECK(data[0] == want);
  CHECK(data[1] == want);
  CHECK(copies[0].to_host == 2);  // one staging copy out per collective, one back
  CHECK(copies[0].from_host == 2);
}

TEST_CASE("a staged receive dropped before its data came aborts cleanly; its request outlives the communicator",
          "[comm]") {
  MemoryKeyValueStore store;
  Copies copies[2];
  auto comms = Connect(&store, copies);
  REQUIRE((comms[0] && comms[1]));
  std::vector<float> got(256), other(256);
  auto late = comms[0]->Recv(1, 4, other.data(), other.size() * sizeof(float));
  REQUIRE(late.ok());
  {
    auto recv = comms[1]->Recv(0, 3, got.data(), got.size() * sizeof(float));
    REQUIRE(recv.ok());
  }  // destroyed unfinished: the host transfer is aborted before its staging buffer goes
  CHECK(copies[1].from_host == 0);
  comms[0].reset();
  // Waiting after the communicator is gone ends (aborted), never touching freed state.
  CHECK_FALSE((*late)->Wait(absl::Now() + absl::Seconds(5)).ok());
}

TEST_CASE("a failed device copy fails the operation that needed it", "[comm]") {
  MemoryKeyValueStore store;
  Copies copies[2];
  auto comms = Connect(&store, copies);
  REQUIRE((comms[0] && comms[1]));
  copies[0].fail_to_host = true;
  float x = 1;
  auto send = comms[0]->Send(1, 1, &x, sizeof(x));
  CHECK(send.status().code() == absl::StatusCode::kInternal);
  CHECK(comms[0]->AllReduceSum({0}, &x, 1, absl::Now() + absl::Seconds(5)).code() == absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace dynapipe::runtime::comm
