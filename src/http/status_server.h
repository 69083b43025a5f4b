#pragma once

// The read-only HTTP status endpoint every daemon serves:
//   GET /healthz  200 "ok", or 503 with the reason
//   GET /status   JSON from the daemon
//   GET /metrics  Prometheus text
// Other methods and paths get 405 / 404.
//
// Slow or stalled clients cannot take it down: every read and write has a
// short deadline, an idle keep-alive connection is closed soon, and enough
// workers serve connections that a few stalled ones leave /healthz answering.
// Its port is exclusive: a second server on a taken port fails to start.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
}

namespace dynapipe::http {

class StatusServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: pick a free port
    std::function<std::string()> health;   // "" = healthy, else the reason
    std::function<std::string()> status;   // JSON object
    std::function<std::string()> metrics;  // Prometheus text

    // A client silent this long in the middle of a request (or a response it
    // does not read) is disconnected: a stalled connection holds a worker at
    // most this long.
    absl::Duration read_timeout = absl::Seconds(2);
    absl::Duration write_timeout = absl::Seconds(2);
    // An idle keep-alive connection is closed after this long, and after
    // this many requests.
    absl::Duration keep_alive_timeout = absl::Seconds(2);
    int keep_alive_max_requests = 16;
    // Connections served at once (a stalled one holds a worker until its
    // read_timeout), and accepted connections waiting for a worker; beyond
    // that the server stops accepting and the kernel's backlog holds the rest.
    int workers = 32;
    int max_queued_connections = 64;
  };

  // Binds `host`:`port` (exclusively: no SO_REUSEPORT) and serves on a thread
  // of its own. UNAVAILABLE naming the address when the port is taken.
  static absl::StatusOr<std::unique_ptr<StatusServer>> Start(Options options);
  ~StatusServer();
  int port() const { return port_; }
  // Stops accepting, waits for the workers (at most about read_timeout).
  void Shutdown();

 private:
  StatusServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace dynapipe::http
