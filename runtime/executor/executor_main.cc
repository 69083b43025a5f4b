// dynapipe-executor: one per device. Registers with the planner, takes ranks
// of jobs, trains, reports. Flags name only this process's identity and
// addresses; everything about a job comes with the job.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/executor/executor.h"
#include "src/common/logging.h"
#include "src/http/status_server.h"
#include "src/rpc/auth.h"

ABSL_FLAG(std::string, planner, "127.0.0.1:50051", "planner gRPC address (host:port)");
ABSL_FLAG(int, device, 0, "device index on this node");
ABSL_FLAG(std::string, node, "", "node name (default: the host name)");
ABSL_FLAG(std::string, backend, "cpu", "cpu|cuda");
ABSL_FLAG(std::string, token_file, "", "file holding the shared API token (empty: no authentication)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate of the planner (enables TLS)");
ABSL_FLAG(std::string, data_root, "", "directory that relative dataset and checkpoint paths resolve against");
ABSL_FLAG(std::string, listen_address, "127.0.0.1", "address peers connect to for pipeline and gradient traffic");
ABSL_FLAG(int, comm_timeout_s, 60, "deadline of every transfer and collective wait");
ABSL_FLAG(int, prefetch, 2, "plans fetched ahead of the running iteration");
ABSL_FLAG(int, http_port, 0, "status endpoint port (0 picks one, -1 disables)");
ABSL_FLAG(std::string, port_file, "", "write the status endpoint's port here");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, log_file, "", "also log to this file");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using dynapipe::runtime::executor::Executor;
  const std::string name = "executor-" + std::to_string(absl::GetFlag(FLAGS_device));
  if (auto s = dynapipe::InitLogging({name, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_log_file)}); !s.ok()) {
    std::fprintf(stderr, "dynapipe-executor: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  dynapipe::runtime::executor::ExecutorOptions o;
  o.planner.address = absl::GetFlag(FLAGS_planner);
  auto token = dynapipe::rpc::ReadToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    spdlog::critical("{}", token.status().message());
    return 2;
  }
  o.planner.token = *token;
  o.planner.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  o.device = absl::GetFlag(FLAGS_device);
  o.node = absl::GetFlag(FLAGS_node);
  if (o.node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.node = host;
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cpu") {
    spdlog::critical("--backend: \"{}\" is not available in this build (cpu only; the CUDA backend is issue 6)",
                     backend);
    return 2;
  }
  o.backend = dynapipe::proto::Backend::cpu;
  o.data_root = absl::GetFlag(FLAGS_data_root);
  o.listen_address = absl::GetFlag(FLAGS_listen_address);
  o.comm_timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s));
  o.prefetch = absl::GetFlag(FLAGS_prefetch);
  Executor executor(o);
  std::unique_ptr<dynapipe::http::StatusServer> http;
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    dynapipe::http::StatusServer::Options ho;
    ho.port = absl::GetFlag(FLAGS_http_port);
    ho.health = [&] { return executor.HealthProblem(); };
    ho.status = [&] { return executor.StatusJson(); };
    ho.metrics = [&] { return executor.MetricsText(); };
    auto started = dynapipe::http::StatusServer::Start(ho);
    if (!started.ok()) {
      spdlog::critical("status endpoint: {}", started.status().message());
      return 2;
    }
    http = std::move(*started);
    spdlog::info("status endpoint on http://127.0.0.1:{}/status", http->port());
    if (const std::string pf = absl::GetFlag(FLAGS_port_file); !pf.empty()) {
      std::ofstream(pf + ".tmp") << http->port() << "\n";
      std::rename((pf + ".tmp").c_str(), pf.c_str());
    }
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  absl::Status s;
  std::atomic<bool> done{false};
  std::thread runner([&] {
    s = executor.Run();
    done = true;
  });
  while (!g_stop && !done) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (g_stop) spdlog::info("signal received: stopping");
  executor.Shutdown();
  runner.join();
  if (http) http->Shutdown();
  if (!s.ok()) {
    spdlog::critical("{}", s.message());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}
