#include "runtime/executor/executor_server.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

absl::StatusOr<std::unique_ptr<ExecutorServer>> ExecutorServer::Start(ExecutorServerOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(options.backend));
  spdlog::info("backend: {}", backend->Describe());
  std::unique_ptr<ExecutorServer> server(new ExecutorServer());
  server->executor_ = std::make_unique<Executor>(options.executor, std::move(backend));
  Executor* executor = server->executor_.get();
  if (options.http_port >= 0) {
    http::StatusServer::Options ho;
    ho.host = options.http_host;
    ho.port = options.http_port;
    ho.health = [executor] { return executor->HealthProblem(); };
    ho.status = [executor] { return executor->StatusJson(); };
    ho.metrics = [executor] { return executor->MetricsText(); };
    auto started = http::StatusServer::Start(ho);
    if (!started.ok()) return Annotate(started.status(), "--http-host/--http-port");
    server->http_ = std::move(*started);
    spdlog::info("status endpoint on http://{}:{}/status", options.http_host, server->http_->port());
    if (!options.port_file.empty()) {
      const std::string tmp = options.port_file + ".tmp";
      std::ofstream(tmp) << server->http_->port() << "\n";
      if (std::rename(tmp.c_str(), options.port_file.c_str()) != 0) {
        return absl::FailedPreconditionError(absl::StrCat("--port-file: cannot write ", options.port_file));
      }
    }
  }
  ExecutorServer* self = server.get();
  server->runner_ = std::thread([self] {
    self->result_ = self->executor_->Run();
    self->done_ = true;
  });
  return server;
}

ExecutorServer::~ExecutorServer() {
  Shutdown();
  (void)Wait();
}

void ExecutorServer::Shutdown() { executor_->Shutdown(); }

absl::Status ExecutorServer::Wait() {
  if (runner_.joinable()) runner_.join();
  if (http_) http_->Shutdown();
  return result_;
}

}  // namespace dynapipe::runtime::executor
