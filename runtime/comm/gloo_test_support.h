#pragma once

// What the Gloo communicator's tests share: ranks as threads of the test
// process talking over 127.0.0.1. Catch2's assertions are not thread-safe,
// so rank threads only record results and the main thread checks them.

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "runtime/comm/gloo_comm.h"
#include "runtime/comm/kv_store.h"
#include "src/common/logging.h"

namespace dynapipe::runtime::comm::testing {

using Comms = std::vector<std::unique_ptr<Communicator>>;

// Runs fn(rank) on one thread per rank and joins them.
inline void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

inline GlooOptions Options(int rank, int size, std::string job,
                    absl::Duration connect_timeout = absl::Seconds(10)) {
  GlooOptions options;
  options.rank = rank;
  options.size = size;
  options.job_prefix = std::move(job);
  options.connect_timeout = connect_timeout;
  return options;
}

// Connects n ranks on their own threads. `configure` adjusts each rank's
// options; `on_rank` runs on each rank's thread once it has connected.
inline Comms Connect(int n, KeyValueStore* store, std::string job = "job1",
                     const std::function<void(GlooOptions&)>& configure = {},
                     const std::function<void(int)>& on_rank = {}) {
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
    GlooOptions options = Options(r, n, job);
    if (configure) configure(options);
    absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(options, store);
    statuses[r] = comm.status();
    if (comm.ok()) comms[r] = *std::move(comm);
    if (on_rank) on_rank(r);
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
inline std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (uint8_t& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

inline bool Contains(const absl::Status& status, absl::string_view text) {
  return absl::StrContains(status.message(), text);
}

}  // namespace dynapipe::runtime::comm::testing
