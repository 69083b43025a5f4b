#include "runtime/comm/gloo_comm.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "runtime/comm/kv_store.h"
#include "src/common/logging.h"

// Ranks are threads of the test process talking over 127.0.0.1. Catch2's
// assertions are not thread-safe, so rank threads only record results and the
// main thread checks them.

namespace dynapipe::runtime::comm {
namespace {

using Comms = std::vector<std::unique_ptr<Communicator>>;

// Runs fn(rank) on one thread per rank and joins them.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

GlooOptions Options(int rank, int size, std::string job,
                    absl::Duration connect_timeout = absl::Seconds(10)) {
  GlooOptions options;
  options.rank = rank;
  options.size = size;
  options.job_prefix = std::move(job);
  options.connect_timeout = connect_timeout;
  return options;
}

Comms Connect(int n, KeyValueStore* store) {
  // Before any rank thread logs, as a daemon's main() does: spdlog creates its
  // registry on first use, inside the uninstrumented library, which
  // ThreadSanitizer would report as a race between the first loggers.
  static const bool logging =
      InitLogging(LoggingOptions{.process_name = "gloo_comm_test", .level = "info", .file = ""})
          .ok();
  REQUIRE(logging);
  Comms comms(n);
  std::vector<absl::Status> statuses(n);
  OnRanks(n, [&](int r) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        CreateGlooCommunicator(Options(r, n, "job1"), store);
    statuses[r] = comm.status();
    if (comm.ok()) comms[r] = *std::move(comm);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    REQUIRE(statuses[r].ok());
    REQUIRE(comms[r]->rank() == r);
    REQUIRE(comms[r]->size() == n);
  }
  return comms;
}

// Deterministic bytes, different for every seed.
std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (uint8_t& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

bool Contains(const absl::Status& status, absl::string_view text) {
  return absl::StrContains(status.message(), text);
}

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

// Nice values of this process's threads, by thread id (Linux keeps nice per thread).
std::map<int, int> ThreadNices() {
  std::map<int, int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    const int tid = std::stoi(entry.path().filename().string());
    errno = 0;
    const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    if (errno == 0) out[tid] = nice;
  }
  return out;
}

TEST_CASE("Gloo's event loop runs at options.event_loop_nice and the caller keeps its priority") {
  REQUIRE(getpriority(PRIO_PROCESS, 0) == 0);
  const std::map<int, int> before = ThreadNices();
  MemoryKeyValueStore store;
  Comms comms(2);
  std::vector<absl::Status> statuses(2);
  std::vector<int> caller_nice(2, -1);
  OnRanks(2, [&](int r) {
    GlooOptions options = Options(r, 2, "nice");
    options.event_loop_nice = 7;
    auto comm = CreateGlooCommunicator(options, &store);
    statuses[r] = comm.status();
    if (comm.ok()) comms[r] = *std::move(comm);
    caller_nice[r] = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    REQUIRE(statuses[r].ok());
    CHECK(caller_nice[r] == 0);
  }
  // One event loop per rank's device, new since `before`, at nice 7.
  int loops = 0;
  for (const auto& [tid, nice] : ThreadNices()) {
    if (!before.contains(tid) && nice == 7) ++loops;
  }
  CHECK(loops == 2);
  CHECK(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))) == 0);

  // Data still flows with the loops at a low priority.
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

}  // namespace
}  // namespace dynapipe::runtime::comm

namespace dynapipe::runtime::comm {
namespace {

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
