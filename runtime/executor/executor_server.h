#pragma once

// The dynapipe-executor process minus flag parsing: the compute backend of
// its device, the Executor serving jobs on a thread of its own, and the HTTP
// status endpoint. Start() fails, before anything runs, with one line naming
// the flag to fix (a backend this build or machine lacks, a taken port).

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/backend/backend.h"
#include "runtime/executor/executor.h"
#include "src/http/status_server.h"
#include "src/rpc/defaults.h"

namespace dynapipe::runtime::executor {

struct ExecutorServerOptions {
  ExecutorOptions executor;
  BackendOptions backend;
  std::string http_host{rpc::kLoopbackHost};  // the status endpoint's address
  int http_port = 0;      // 0 picks a free port, -1 disables the endpoint
  std::string port_file;  // where the endpoint's port is written (atomically), if set
};

class ExecutorServer {
 public:
  static absl::StatusOr<std::unique_ptr<ExecutorServer>> Start(ExecutorServerOptions options);
  // Shuts down and waits.
  ~ExecutorServer();
  ExecutorServer(const ExecutorServer&) = delete;
  ExecutorServer& operator=(const ExecutorServer&) = delete;

  // The status endpoint's port (-1 when disabled).
  int http_port() const { return http_ ? http_->port() : -1; }
  // Whether the executor stopped by itself (an error retrying cannot fix).
  bool done() const { return done_; }
  // Thread-safe: stops the running job's communication and the executor.
  void Shutdown();
  // Waits for the executor to stop (after Shutdown, or on its own) and
  // returns why it stopped: OK after Shutdown.
  absl::Status Wait();

 private:
  ExecutorServer() = default;

  std::unique_ptr<Executor> executor_;
  std::unique_ptr<http::StatusServer> http_;
  std::thread runner_;
  std::atomic<bool> done_{false};
  absl::Status result_;  // written by runner_ before done_
};

}  // namespace dynapipe::runtime::executor
