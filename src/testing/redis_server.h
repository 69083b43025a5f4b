#pragma once

// A real redis-server for tests, on a free loopback port, with no
// persistence. Stopped (SIGTERM, then SIGKILL) when destroyed.

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dynapipe::testing {

class RedisServer {
 public:
  // Starts redis-server (found on PATH) and waits until it answers PING.
  // `persistent`: an append-only file (fsync always) in a private directory,
  // so Restart() brings the data back (a Redis outage, not a wipe).
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(absl::Duration timeout = absl::Seconds(10),
                                                            bool persistent = false);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }  // for fault injection (SIGKILL, SIGSTOP); Restart() reaps it
  // Stops the server (all data is lost); the port stays reserved for Restart.
  void Stop();
  // Starts a fresh, empty server on the same port (simulates a Redis blip).
  absl::Status Restart(absl::Duration timeout = absl::Seconds(10));

 private:
  explicit RedisServer(int port, std::string dir) : port_(port), dir_(std::move(dir)) {}
  absl::Status Spawn(absl::Duration timeout);

  int port_;
  std::string dir_;  // non-empty: persistent
  pid_t pid_ = -1;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
absl::StatusOr<int> PickFreeLoopbackPort();

// True when a Redis server on 127.0.0.1:port answers PING within `timeout`.
bool RedisAnswersPing(int port, absl::Duration timeout);

}  // namespace dynapipe::testing
