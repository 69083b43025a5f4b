#pragma once

// The read-only HTTP status endpoint every daemon serves:
//   GET /healthz  200 "ok", or 503 with the reason
//   GET /status   JSON from the daemon
//   GET /metrics  Prometheus text
// Other methods and paths get 405 / 404.
//
// Slow or stalled clients cannot take it down: a request head must arrive
// whole within a short deadline, every write has one, an idle keep-alive
// connection is closed soon, and enough workers serve connections that a few
// stalled ones leave /healthz answering. Request heads are parsed strictly
// (request_head.h) and bodies never read. Its port is exclusive: a second
// server on a taken port fails to start.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/rpc/defaults.h"

namespace dynapipe::http {

struct RequestHead;

class StatusServer {
 public:
  struct Options {
    std::string host{rpc::kLoopbackHost};
    int port = 0;  // 0: pick a free port
    std::function<std::string()> health;   // "" = healthy, else the reason
    std::function<std::string()> status;   // JSON object
    std::function<std::string()> metrics;  // Prometheus text

    // A request head not complete this long after its first byte (or after
    // the connection opened), or a response not taken this long, ends the
    // connection: a stalled connection holds a worker at most this long.
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
  class Pool;
  explicit StatusServer(Options options);
  void AcceptLoop();
  // Serves one connection until it closes, fails, idles out or the server stops.
  void Serve(int fd);
  // What to answer a parsed request with (status, content type, body).
  struct Response {
    int status = 200;
    std::string content_type = "text/plain";
    std::string body;
  };
  Response Route(const RequestHead& head) const;

  const Options options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd, readable from the moment Shutdown begins
  std::unique_ptr<Pool> pool_;
  std::thread accept_thread_;
  std::atomic<bool> shut_down_{false};
  int port_ = 0;
};

}  // namespace dynapipe::http
