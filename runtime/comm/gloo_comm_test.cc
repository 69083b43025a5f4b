#include "runtime/comm/gloo_comm.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "runtime/comm/gloo_test_support.h"
#include "runtime/comm/kv_store.h"

// Connecting, point-to-point transfers, aborts and lost peers; the
// collectives are in gloo_collectives_test.cc. Helpers: gloo_test_support.h.

namespace dynapipe::runtime::comm {
namespace {

using testing::Comms;
using testing::Connect;
using testing::Contains;
using testing::OnRanks;
using testing::Options;
using testing::Pattern;

TEST_CASE("CreateGlooCommunicator gives up with DEADLINE_EXCEEDED when a rank never arrives") {
  MemoryKeyValueStore store;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(Options(0, 2, "alone", absl::Milliseconds(300)), &store);
  const absl::Duration elapsed = absl::Now() - start;
  INFO(comm.status());
  CHECK(absl::IsDeadlineExceeded(comm.status()));
  CHECK(Contains(comm.status(), "alone/world/1"));
  CHECK(elapsed < absl::Seconds(3));

  CHECK(absl::IsInvalidArgument(CreateGlooCommunicator(Options(2, 2, "j"), &store).status()));
  CHECK(absl::IsInvalidArgument(CreateGlooCommunicator(Options(0, 1, ""), &store).status()));
}

TEST_CASE(
    "Send/Recv deliver tagged buffers intact, waited out of order and in both directions at once") {
  MemoryKeyValueStore store;
  const int n = 4;
  Comms comms = Connect(n, &store);
  // 8 MiB is more than the socket buffers take at once, so Gloo's I/O thread
  // finishes that send; 0 bytes is a bare header.
  const std::vector<size_t> sizes = {1024, 8 << 20, 0, 17};  // by tag 1..4

  struct Result {
    std::vector<absl::Status> statuses;
    std::vector<std::vector<uint8_t>> ring;  // from the left neighbour, by tag - 1
    std::vector<uint8_t> partner;            // from rank ^ 1, tag 7
  };
  std::vector<Result> results(n);
  OnRanks(n, [&](int r) {
    Result& result = results[r];
    Communicator& comm = *comms[r];
    const int right = (r + 1) % n;
    const int left = (r + n - 1) % n;
    const int partner = r ^ 1;
    auto record = [&](const absl::Status& status) { result.statuses.push_back(status); };

    std::vector<std::vector<uint8_t>> outgoing;
    for (int tag = 1; tag <= 4; ++tag) outgoing.push_back(Pattern(sizes[tag - 1], r * 100 + tag));
    result.ring.resize(4);
    for (int tag = 1; tag <= 4; ++tag) result.ring[tag - 1].resize(sizes[tag - 1]);

    // Sends go out in tag order, receives are posted in the opposite order
    // (so some find their sender waiting and some wait for it) and waited in a
    // third one.
    std::vector<std::unique_ptr<Request>> sends, recvs(4);
    for (int tag = 1; tag <= 4; ++tag) {
      auto send = comm.Send(right, tag, outgoing[tag - 1].data(), outgoing[tag - 1].size());
      record(send.status());
      if (send.ok()) sends.push_back(*std::move(send));
    }
    for (int tag = 4; tag >= 1; --tag) {
      auto recv = comm.Recv(left, tag, result.ring[tag - 1].data(), result.ring[tag - 1].size());
      record(recv.status());
      if (recv.ok()) recvs[tag - 1] = *std::move(recv);
    }
    // With the partner: both send and receive on the same tag at once.
    const std::vector<uint8_t> mine = Pattern(4096, 1000 + r);
    result.partner.resize(4096);
    auto to_partner = comm.Send(partner, 7, mine.data(), mine.size());
    auto from_partner = comm.Recv(partner, 7, result.partner.data(), result.partner.size());
    record(to_partner.status());
    record(from_partner.status());

    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    if (from_partner.ok()) record((*from_partner)->Wait(deadline));
    if (to_partner.ok()) record((*to_partner)->Wait(deadline));
    for (int tag : {2, 4, 1, 3}) {
      if (recvs[tag - 1] != nullptr) record(recvs[tag - 1]->Wait(deadline));
    }
    for (auto& send : sends) record(send->Wait(deadline));
  });

  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const Result& result = results[r];
    REQUIRE(result.statuses.size() == 4 + 4 + 2 + 2 + 4 + 4);
    for (const absl::Status& status : result.statuses) {
      INFO(status);
      CHECK(status.ok());
    }
    const int left = (r + n - 1) % n;
    for (int tag = 1; tag <= 4; ++tag) {
      INFO("tag " << tag);
      CHECK(result.ring[tag - 1] == Pattern(sizes[tag - 1], left * 100 + tag));
    }
    CHECK(result.partner == Pattern(4096, 1000 + (r ^ 1)));
  }
}

// Scheduling of this process's threads, by thread id (Linux keeps the policy
// and the nice value per thread).
struct ThreadPriority {
  int policy = -1;
  int nice = 0;
};
std::map<int, ThreadPriority> ThreadPriorities() {
  std::map<int, ThreadPriority> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    const int tid = std::stoi(entry.path().filename().string());
    errno = 0;
    const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    const int policy = sched_getscheduler(tid);
    if (errno == 0 && policy >= 0) out[tid] = {policy, nice};
  }
  return out;
}

ThreadPriority CallerPriority() {
  const auto tid = static_cast<pid_t>(syscall(SYS_gettid));
  return {sched_getscheduler(tid), getpriority(PRIO_PROCESS, static_cast<id_t>(tid))};
}

// Connects two ranks with `configure` applied to their options and returns
// the scheduling of the threads the connection started (Gloo's event loops)
// and of the two callers; the communicators go to `comms`.
struct Started {
  std::vector<ThreadPriority> new_threads;
  std::vector<ThreadPriority> callers;
};
Started ConnectTwo(MemoryKeyValueStore* store, const std::string& job, Comms* comms,
                   const std::function<void(GlooOptions&)>& configure) {
  const std::map<int, ThreadPriority> before = ThreadPriorities();
  Started out;
  out.callers.resize(2);
  *comms = Connect(2, store, job, configure, [&](int r) { out.callers[r] = CallerPriority(); });
  for (const auto& [tid, p] : ThreadPriorities()) {
    if (!before.contains(tid)) out.new_threads.push_back(p);
  }
  return out;
}

// A 256 KiB transfer from rank 0 to rank 1 arrives intact.
void CheckDataFlows(Comms& comms) {
  std::vector<uint8_t> sent = Pattern(1 << 18, 3), got(sent.size());
  std::vector<absl::Status> done(2);
  OnRanks(2, [&](int r) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    auto req = r == 0 ? comms[0]->Send(1, 9, sent.data(), sent.size()) : comms[1]->Recv(0, 9, got.data(), got.size());
    done[r] = req.ok() ? (*req)->Wait(deadline) : req.status();
  });
  CHECK(done[0].ok());
  CHECK(done[1].ok());
  CHECK(got == sent);
}

TEST_CASE("Gloo's event loop runs under SCHED_IDLE by default and the caller keeps its priority") {
  REQUIRE(CallerPriority().policy == SCHED_OTHER);
  REQUIRE(CallerPriority().nice == 0);
  MemoryKeyValueStore store;
  Comms comms(2);
  const Started started = ConnectTwo(&store, "idle", &comms, [](GlooOptions&) {});
  // One event loop per rank's device.
  int loops = 0;
  for (const ThreadPriority& p : started.new_threads) loops += p.policy == SCHED_IDLE;
  CHECK(loops == 2);
  for (const ThreadPriority& p : started.callers) {
    CHECK(p.policy == SCHED_OTHER);
    CHECK(p.nice == 0);
  }
  CHECK(CallerPriority().policy == SCHED_OTHER);
  CheckDataFlows(comms);
}

TEST_CASE("Without event_loop_idle the loop runs at options.event_loop_nice") {
  REQUIRE(CallerPriority().nice == 0);
  MemoryKeyValueStore store;
  Comms comms(2);
  const Started started = ConnectTwo(&store, "nice", &comms, [](GlooOptions& o) {
    o.event_loop_idle = false;
    o.event_loop_nice = 7;
  });
  int loops = 0;
  for (const ThreadPriority& p : started.new_threads) loops += p.policy == SCHED_OTHER && p.nice == 7;
  CHECK(loops == 2);
  for (const ThreadPriority& p : started.callers) {
    CHECK(p.policy == SCHED_OTHER);
    CHECK(p.nice == 0);
  }
  CheckDataFlows(comms);

  for (const int bad : {-1, 20}) {
    GlooOptions options = Options(0, 1, "nice-bad");
    options.event_loop_nice = bad;
    const auto comm = CreateGlooCommunicator(options, &store);
    CHECK(comm.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(comm.status(), "options.event_loop_nice"));
  }
}

TEST_CASE("Send/Recv reject bad peers and null buffers") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  char byte = 0;
  CHECK(absl::IsInvalidArgument(comms[0]->Send(0, 1, &byte, 1).status()));
  CHECK(absl::IsInvalidArgument(comms[0]->Send(2, 1, &byte, 1).status()));
  CHECK(absl::IsInvalidArgument(comms[0]->Recv(-1, 1, &byte, 1).status()));
  CHECK(absl::IsInvalidArgument(comms[0]->Recv(1, 1, nullptr, 1).status()));
}

TEST_CASE(
    "A Recv whose peer never sends ends with DEADLINE_EXCEEDED at its deadline and fails the peer "
    "fast") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  char buffer[64];
  char other[8];
  // Rank 1 waits (long deadline) on a transfer that rank 0's failure kills.
  auto peer_recv = comms[1]->Recv(0, 9, other, sizeof(other));
  REQUIRE(peer_recv.ok());
  absl::Status peer_status;
  absl::Duration peer_elapsed;
  std::thread peer([&] {
    const absl::Time start = absl::Now();
    peer_status = (*peer_recv)->Wait(start + absl::Seconds(10));
    peer_elapsed = absl::Now() - start;
  });

  auto recv = comms[0]->Recv(1, 5, buffer, sizeof(buffer));
  REQUIRE(recv.ok());
  const absl::Duration timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  const absl::Status status = (*recv)->Wait(start + timeout);
  const absl::Duration elapsed = absl::Now() - start;
  peer.join();

  INFO(status);
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(Contains(status, "recv of 64 bytes from rank 1 (tag 5)"));
  CHECK(elapsed >= timeout);
  CHECK(elapsed < timeout + absl::Milliseconds(500));
  CHECK((*recv)->Wait(absl::Now() + absl::Seconds(1)) == status);  // final

  INFO(peer_status);
  CHECK(absl::IsUnavailable(peer_status));
  CHECK(Contains(peer_status, "from rank 0"));
  CHECK(peer_elapsed < absl::Seconds(3));

  // Rank 0's communicator is aborted, naming the cause.
  const absl::Status later = comms[0]->Send(1, 1, buffer, 1).status();
  INFO(later);
  CHECK(absl::IsAborted(later));
  CHECK(Contains(later, "did not complete"));
}

TEST_CASE("Abort from another thread ends pending waits and collectives with ABORTED promptly") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  const std::vector<int> pair = {0, 1};
  double warm[4] = {1, 2, 3, 4};
  OnRanks(2, [&](int r) {
    double mine[4] = {1, 2, 3, 4};
    const absl::Status status =
        comms[r]->AllReduceSum(pair, mine, 4, absl::Now() + absl::Seconds(10));
    if (r == 0 && status.ok()) std::copy(mine, mine + 4, warm);
  });
  REQUIRE(warm[3] == 8.0);

  char buffer[128];
  auto recv = comms[0]->Recv(1, 3, buffer, sizeof(buffer));
  REQUIRE(recv.ok());
  char peer_buffer[128];
  auto peer_recv = comms[1]->Recv(0, 3, peer_buffer, sizeof(peer_buffer));
  REQUIRE(peer_recv.ok());
  absl::Status recv_status, reduce_status, peer_status;
  absl::Duration recv_elapsed, reduce_elapsed, peer_elapsed;
  auto timed = [](absl::Status& status, absl::Duration& elapsed,
                  const std::function<absl::Status()>& fn) {
    const absl::Time start = absl::Now();
    status = fn();
    elapsed = absl::Now() - start;
  };
  std::thread waiter([&] {
    timed(recv_status, recv_elapsed,
          [&] { return (*recv)->Wait(absl::Now() + absl::Seconds(10)); });
  });
  std::thread reducer([&] {  // rank 1 never joins this one
    float x[1000] = {};
    timed(reduce_status, reduce_elapsed,
          [&] { return comms[0]->AllReduceSum(pair, x, 1000, absl::Now() + absl::Seconds(10)); });
  });
  std::thread peer([&] {
    timed(peer_status, peer_elapsed,
          [&] { return (*peer_recv)->Wait(absl::Now() + absl::Seconds(10)); });
  });
  absl::SleepFor(absl::Milliseconds(200));
  std::thread aborter([&] { comms[0]->Abort(); });
  aborter.join();
  waiter.join();
  reducer.join();
  peer.join();

  INFO(recv_status);
  CHECK(absl::IsAborted(recv_status));
  CHECK(Contains(recv_status, "from rank 1"));
  CHECK(recv_elapsed < absl::Seconds(2));
  INFO(reduce_status);
  CHECK(absl::IsAborted(reduce_status));
  CHECK(reduce_elapsed < absl::Seconds(2));
  // Rank 0's connections were reset, so rank 1 need not wait out its deadline.
  INFO(peer_status);
  CHECK(absl::IsUnavailable(peer_status));
  CHECK(Contains(peer_status, "from rank 0"));
  CHECK(peer_elapsed < absl::Seconds(3));

  // Later operations are refused.
  CHECK(absl::IsAborted(comms[0]->Send(1, 1, buffer, 1).status()));
  CHECK(absl::IsAborted(comms[0]->AllReduceSum(pair, warm, 4, absl::Now() + absl::Seconds(1))));
  comms[0]->Abort();  // idempotent
}

TEST_CASE("Abort ends an AllReduceSum still waiting for a member to connect the group") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  absl::Status status;
  absl::Duration elapsed;
  std::thread reducer([&] {  // rank 1 never joins
    float x[4] = {};
    const absl::Time start = absl::Now();
    status = comms[0]->AllReduceSum(std::vector<int>{0, 1}, x, 4, start + absl::Seconds(10));
    elapsed = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));
  comms[0]->Abort();
  reducer.join();
  INFO(status);
  CHECK(absl::IsAborted(status));
  CHECK(Contains(status, "connecting group {0,1}"));
  CHECK(elapsed < absl::Seconds(2));
}

TEST_CASE("A peer that goes away fails the waits on it well before their deadlines") {
  const bool destroy = GENERATE(true, false);  // reruns the whole case
  MemoryKeyValueStore store;
  Comms comms = Connect(3, &store);
  INFO((destroy ? "peer destroyed" : "peer aborted"));

  char buffer[256];
  auto recv = comms[0]->Recv(1, 4, buffer, sizeof(buffer));
  REQUIRE(recv.ok());
  absl::Status status;
  absl::Duration elapsed;
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    status = (*recv)->Wait(start + absl::Seconds(10));
    elapsed = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(100));
  if (destroy) {
    comms[1].reset();
  } else {
    comms[1]->Abort();
  }
  waiter.join();
  INFO(status);
  CHECK(absl::IsUnavailable(status));
  CHECK(Contains(status, "recv of 256 bytes from rank 1 (tag 4): connection to rank 1 failed"));
  CHECK(elapsed < absl::Seconds(3));
  // The failure names the lost peer, and so does every later one it aborted.
  CHECK(LostPeer(status) == std::optional<int>(1));
  const absl::Status later = comms[0]->Recv(2, 5, buffer, sizeof(buffer)).status();
  INFO(later);
  CHECK(absl::IsAborted(later));
  CHECK(LostPeer(later) == std::optional<int>(1));
}

TEST_CASE(
    "An all-reduce missing a vanished member fails on every other member, not at the deadline") {
  MemoryKeyValueStore store;
  Comms comms = Connect(3, &store);
  const std::vector<int> world = {0, 1, 2};
  OnRanks(3, [&](int r) {  // connect the group's mesh first
    float x[8] = {};
    comms[r]->AllReduceSum(world, x, 8, absl::Now() + absl::Seconds(10)).IgnoreError();
  });
  comms[2].reset();
  std::vector<absl::Status> statuses(2);
  std::vector<absl::Duration> elapsed(2);
  OnRanks(2, [&](int r) {
    std::vector<float> x(1000, 1.0f);
    const absl::Time start = absl::Now();
    statuses[r] = comms[r]->AllReduceSum(world, x.data(), x.size(), start + absl::Seconds(10));
    elapsed[r] = absl::Now() - start;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    CHECK(!statuses[r].ok());
    CHECK(!absl::IsDeadlineExceeded(statuses[r]));
    CHECK(Contains(statuses[r], "all-reduce of 1000 floats over ranks {0,1,2}"));
    CHECK(elapsed[r] < absl::Seconds(3));
    CHECK(LostPeer(statuses[r]).has_value());  // rank 2, or a member that aborted on losing it
  }
}

TEST_CASE("Destroying an unfinished Request aborts the communicator, naming the transfer") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  char buffer[32];
  {
    auto recv = comms[0]->Recv(1, 2, buffer, sizeof(buffer));
    REQUIRE(recv.ok());
  }
  const absl::Status later = comms[0]->Recv(1, 3, buffer, sizeof(buffer)).status();
  INFO(later);
  CHECK(absl::IsAborted(later));
  CHECK(Contains(later, "recv of 32 bytes from rank 1 (tag 2) was destroyed before it completed"));
  CHECK_FALSE(LostPeer(later).has_value());  // a local mistake, not a lost peer
}

TEST_CASE("A send travels from its start: the receiver completes while the sender has not waited") {
  MemoryKeyValueStore store;
  Comms comms = Connect(2, &store);
  std::vector<uint8_t> out = Pattern(1 << 20, 7), in(1 << 20);
  auto send = comms[0]->Send(1, 3, out.data(), out.size());
  REQUIRE(send.ok());
  auto recv = comms[1]->Recv(0, 3, in.data(), in.size());
  REQUIRE(recv.ok());
  // The sender computes meanwhile (does not wait); the bytes arrive anyway.
  CHECK((*recv)->Wait(absl::Now() + absl::Seconds(5)).ok());
  CHECK(in == out);
  CHECK((*send)->Wait(absl::Now() + absl::Seconds(5)).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::comm
