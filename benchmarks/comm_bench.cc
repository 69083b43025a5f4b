// What one pipeline hand-off costs on the Gloo communicator: ranks as
// threads of this process (as in cpu_throughput), paired (0, 1), (2, 3), ...,
// each pair passing one buffer back and forth. Per message size it prints the
// wall time per transfer and the process's CPU time (user + system, every
// thread: ranks and Gloo's) per transfer and pair, medians over rounds:
//   comm_bench --ranks 4 --bytes 4096,262144 --transfers 2000 --rounds 3 --event_loop 0,19,idle
// With more ranks than cores the CPU figure is what each hand-off takes from
// compute (cpu_throughput's "cpu s" at pp 2 x dp 2 follows the number of
// micro-batches by about that much per transfer).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "runtime/comm/gloo_comm.h"
#include "runtime/comm/kv_store.h"
#include "src/common/clock.h"
#include "src/common/flags.h"
#include "src/common/stats.h"
#include "src/common/status_macros.h"

ABSL_FLAG(int, ranks, 2, "ranks (threads), an even number: pairs (0, 1), (2, 3), ...");
ABSL_FLAG(std::string, bytes, "4096,262144", "message sizes, comma-separated");
ABSL_FLAG(int, transfers, 2000, "transfers per pair and round");
ABSL_FLAG(int, rounds, 3, "rounds per size (medians are printed)");
ABSL_FLAG(std::string, event_loop, "19,idle",
          "scheduling of Gloo's event-loop threads to compare, comma-separated: a nice value from 0 to 19 "
          "(GlooOptions::event_loop_nice) or idle (SCHED_IDLE, GlooOptions::event_loop_idle)");

namespace {

using namespace dynapipe;
using runtime::comm::Communicator;

// One setting of --event_loop: SCHED_IDLE, or a nice value.
struct LoopPriority {
  bool idle = false;
  int nice = 0;
  std::string Name() const { return idle ? "idle" : std::to_string(nice); }
};

struct Figures {
  double wall_us = 0;  // per transfer
  double cpu_us = 0;   // per transfer and pair
};

// One round: every pair passes `bytes` back and forth `transfers` times.
// Timing starts once every rank is connected and stops when the last ends.
absl::StatusOr<Figures> Round(int ranks, size_t bytes, int transfers, int round, LoopPriority loop) {
  runtime::comm::MemoryKeyValueStore kv;
  std::vector<std::unique_ptr<Communicator>> comms(ranks);
  std::vector<absl::Status> status(ranks);
  {
    std::vector<std::thread> connect;
    for (int r = 0; r < ranks; ++r) {
      connect.emplace_back([&, r] {
        runtime::comm::GlooOptions options;
        options.rank = r;
        options.size = ranks;
        options.job_prefix = "comm_bench/" + std::to_string(round) + "/";
        options.event_loop_idle = loop.idle;
        options.event_loop_nice = loop.nice;
        auto c = runtime::comm::CreateGlooCommunicator(options, &kv);
        if (c.ok()) {
          comms[r] = std::move(*c);
        } else {
          status[r] = c.status();
        }
      });
    }
    for (auto& t : connect) t.join();
  }
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);

  std::vector<std::thread> threads;
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<char> buffer(bytes, static_cast<char>(r));
      const int peer = r ^ 1;
      status[r] = [&]() -> absl::Status {
        for (int i = 0; i < transfers; ++i) {
          const absl::Time deadline = absl::Now() + absl::Seconds(30);
          const bool sends = (r & 1) == (i & 1);
          auto request = sends ? comms[r]->Send(peer, static_cast<uint64_t>(i), buffer.data(), bytes)
                               : comms[r]->Recv(peer, static_cast<uint64_t>(i), buffer.data(), bytes);
          RETURN_IF_ERROR(request.status());
          RETURN_IF_ERROR((*request)->Wait(deadline));
        }
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = ProcessCpuSeconds() - cpu0;
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  const int pairs = ranks / 2;
  return Figures{1e6 * wall / transfers, 1e6 * cpu / (static_cast<double>(transfers) * pairs)};
}

}  // namespace

int main(int argc, char** argv) {
  dynapipe::ParseFlags(argc, argv, "comm_bench",
                       "comm_bench: wall and CPU time per point-to-point transfer on the Gloo communicator, "
                       "pairs of ranks (threads of this process) passing a buffer back and forth");
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int transfers = absl::GetFlag(FLAGS_transfers);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (ranks < 2 || ranks % 2 != 0 || ranks > 64) {
    std::fprintf(stderr, "comm_bench: --ranks: %d is not an even number from 2 to 64\n", ranks);
    return 2;
  }
  if (transfers < 1 || transfers > 10'000'000 || rounds < 1 || rounds > 1000) {
    std::fprintf(stderr, "comm_bench: --transfers must be 1..10000000 and --rounds 1..1000\n");
    return 2;
  }
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_bytes), ',', absl::SkipEmpty())) {
    uint64_t b = 0;
    if (!absl::SimpleAtoi(s, &b) || b == 0 || b > (uint64_t{1} << 30)) {
      std::fprintf(stderr, "comm_bench: --bytes: \"%s\" is not a size from 1 to 1073741824\n", std::string(s).c_str());
      return 2;
    }
    sizes.push_back(static_cast<size_t>(b));
  }
  if (sizes.empty()) {
    std::fprintf(stderr, "comm_bench: --bytes: no sizes\n");
    return 2;
  }
  std::vector<LoopPriority> loops;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_event_loop), ',', absl::SkipEmpty())) {
    LoopPriority p;
    if (s == "idle") {
      p.idle = true;
    } else if (!absl::SimpleAtoi(s, &p.nice) || p.nice < 0 || p.nice > 19) {
      std::fprintf(stderr, "comm_bench: --event_loop: \"%s\" is neither idle nor a nice value from 0 to 19\n",
                   std::string(s).c_str());
      return 2;
    }
    loops.push_back(p);
  }
  if (loops.empty()) {
    std::fprintf(stderr, "comm_bench: --event_loop: no values\n");
    return 2;
  }
  std::printf("%d ranks (%d pairs) on %u hardware threads, %d transfers per pair, medians of %d rounds "
              "(each round runs every --event_loop setting in turn)\n",
              ranks, ranks / 2, std::thread::hardware_concurrency(), transfers, rounds);
  std::printf("%12s %6s %16s %16s\n", "bytes", "loop", "wall us/xfer", "cpu us/xfer");
  for (const size_t bytes : sizes) {
    std::vector<std::vector<double>> wall(loops.size()), cpu(loops.size());
    for (int round = 0; round < rounds; ++round) {
      for (size_t k = 0; k < loops.size(); ++k) {
        auto f = Round(ranks, bytes, transfers, round * static_cast<int>(loops.size()) + static_cast<int>(k), loops[k]);
        if (!f.ok()) {
          std::fprintf(stderr, "comm_bench: %zu bytes: %s\n", bytes, std::string(f.status().message()).c_str());
          return 1;
        }
        wall[k].push_back(f->wall_us);
        cpu[k].push_back(f->cpu_us);
      }
    }
    for (size_t k = 0; k < loops.size(); ++k) {
      std::printf("%12zu %6s %16.1f %16.1f\n", bytes, loops[k].Name().c_str(), Median(wall[k]), Median(cpu[k]));
    }
    std::fflush(stdout);
  }
  return 0;
}
