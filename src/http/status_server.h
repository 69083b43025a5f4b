#pragma once

// The read-only HTTP status endpoint every daemon serves:
//   GET /healthz  200 "ok", or 503 with the reason
//   GET /status   JSON from the daemon
//   GET /metrics  Prometheus text
// Other methods and paths get 405 / 404.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

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
  };

  static absl::StatusOr<std::unique_ptr<StatusServer>> Start(Options options);
  ~StatusServer();
  int port() const { return port_; }
  void Shutdown();

 private:
  StatusServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace dynapipe::http
