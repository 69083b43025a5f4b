// dynapipe-executor: one per device. Registers with the planner, takes ranks
// of jobs, trains, reports. Flags name only this process's identity, device
// and addresses; everything about a job comes with the job.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "runtime/executor/executor_server.h"
#include "src/common/flags.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "src/rpc/auth.h"
#include "src/rpc/defaults.h"
#include "src/rpc/exposure.h"

ABSL_FLAG(std::string, planner, std::string(dynapipe::rpc::kDefaultPlannerAddress),
          "planner gRPC address (host:port), or several planners sharing one Redis (host:port,host:port: the next "
          "is tried when one is down)");
ABSL_FLAG(int, device, 0, "device index on this node");
ABSL_FLAG(std::string, node, "", "node name (default: the host name)");
ABSL_FLAG(std::string, backend, "cpu", "compute backend: cpu (fp32, Gloo) or cuda (bf16, NCCL)");
ABSL_FLAG(std::string, comm, "default",
          "communicator: default (the backend's own), gloo (cuda: staged through the host) or nccl");
ABSL_FLAG(std::string, attention_kernel, dynapipe::runtime::BackendOptions{}.attention_kernel,
          "cuda: the varlen attention kernel: auto (cuDNN's fused attention where it loads and passes a start-up "
          "check against the tiled kernel, else tiled; the log and /status say which), cudnn (or fail) or tiled");
ABSL_FLAG(bool, matmul_epilogues, dynapipe::runtime::BackendOptions{}.matmul_epilogues,
          "cuda: bias, residual, GELU and bias-gradient glue in cuBLASLt's epilogues (false: separate kernels)");
ABSL_FLAG(std::string, token_file, "",
          "file (mode 0600) holding the planner's API token; without one, only loopback addresses unless --insecure");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate of the planner (enables TLS)");
ABSL_FLAG(std::string, data_root, "", "directory that relative dataset and checkpoint paths resolve against");
ABSL_FLAG(std::string, listen_address, "auto",
          "address peers connect to for pipeline and gradient traffic; auto: this machine's address on the route "
          "to the planner (127.0.0.1 for a planner on loopback)");
ABSL_FLAG(int, comm_timeout_s, absl::ToInt64Seconds(dynapipe::runtime::comm::kDefaultCommTimeout),
          "deadline of every transfer and collective wait");
ABSL_FLAG(int, planner_grace_s, dynapipe::rpc::kDefaultPlannerGraceS,
          "a planner outage (restart, network blip) this long is ridden through: calls to it are retried meanwhile");
ABSL_FLAG(int, prefetch, dynapipe::runtime::executor::ExecutorOptions().prefetch,
          "plans fetched ahead of the running iteration");
ABSL_FLAG(std::string, http_port, "auto",
          absl::StrCat("status endpoint port; auto: ", dynapipe::rpc::kExecutorStatusPortBase,
                       " + --device; 0 picks a free one, -1 disables it"));
ABSL_FLAG(std::string, http_host, "auto",
          "status endpoint address; auto: the --listen-address (reachable from the planner's network, so a "
          "scraper there can read /metrics)");
ABSL_FLAG(std::string, port_file, "", "write the status endpoint's port here");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, log_file, "", "also log to this file");

namespace {

namespace rt = dynapipe::runtime;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// The node name: --node, else this machine's host name.
std::string NodeName() {
  std::string node = absl::GetFlag(FLAGS_node);
  if (node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    node = host;
  }
  return node;
}

// The executor's part of the options (planner, identity, addresses, timeouts).
absl::Status ExecutorOptionsFromFlags(const std::string& token, rt::executor::ExecutorOptions& e) {
  e.planner.address = absl::GetFlag(FLAGS_planner);
  e.planner.token = token;
  e.planner.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  if (absl::GetFlag(FLAGS_planner_grace_s) < 1) {
    return absl::InvalidArgumentError("--planner-grace-s: must be at least 1");
  }
  e.planner.timeout = absl::Seconds(absl::GetFlag(FLAGS_planner_grace_s));
  e.device = absl::GetFlag(FLAGS_device);
  e.node = NodeName();
  e.data_root = absl::GetFlag(FLAGS_data_root);
  e.listen_address = absl::GetFlag(FLAGS_listen_address);
  if (e.listen_address == "auto") {
    auto local = dynapipe::rpc::LocalAddressToward(e.planner.address);
    if (!local.ok()) return dynapipe::Annotate(local.status(), "--listen-address=auto");
    e.listen_address = *local;  // logged at registration
  }
  e.comm_timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s));
  if (e.comm_timeout < e.planner.timeout) {
    // Ranks fetch their plans separately: while one waits out a planner
    // outage for its next plan, its peers wait in a transfer or collective.
    spdlog::warn("--comm-timeout-s {} is shorter than --planner-grace-s {}: a planner outage longer than {} s fails "
                 "running jobs instead of being ridden through",
                 absl::GetFlag(FLAGS_comm_timeout_s), absl::GetFlag(FLAGS_planner_grace_s),
                 absl::GetFlag(FLAGS_comm_timeout_s));
  }
  e.prefetch = absl::GetFlag(FLAGS_prefetch);
  return absl::OkStatus();
}

// Every option of the server from the flags, checked.
absl::StatusOr<rt::executor::ExecutorServerOptions> OptionsFromFlags() {
  rt::executor::ExecutorServerOptions o;
  auto token = dynapipe::rpc::ReadToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return dynapipe::Annotate(token.status(), "--token-file");
  auto backend = rt::ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) return backend.status();
  auto comm = rt::ParseCommKind(absl::GetFlag(FLAGS_comm));
  if (!comm.ok()) return comm.status();
  RETURN_IF_ERROR(ExecutorOptionsFromFlags(*token, o.executor));
  o.backend.kind = *backend;
  o.backend.device = o.executor.device;
  o.backend.comm = *comm;
  o.backend.attention_kernel = absl::GetFlag(FLAGS_attention_kernel);
  o.backend.matmul_epilogues = absl::GetFlag(FLAGS_matmul_epilogues);
  o.http_host = absl::GetFlag(FLAGS_http_host);
  if (o.http_host == "auto") o.http_host = o.executor.listen_address;
  if (const std::string port = absl::GetFlag(FLAGS_http_port); port == "auto") {
    o.http_port = dynapipe::rpc::ExecutorStatusPort(o.executor.device);
  } else if (!absl::SimpleAtoi(port, &o.http_port) || o.http_port < -1 || o.http_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-port: expected auto, a port number, 0 (any free port) or -1 (none), got \"",
                     absl::CHexEscape(port), "\""));
  }
  o.port_file = absl::GetFlag(FLAGS_port_file);
  return o;
}

// Without a token, talk to and serve only this machine unless told
// --insecure: the planner's calls, peers' pipeline and gradient traffic
// (Gloo), the status endpoint.
absl::Status CheckExposure(const rt::executor::ExecutorServerOptions& o) {
  std::vector<dynapipe::rpc::Exposure> exposures;
  for (const std::string& planner : dynapipe::rpc::SplitAddressList(o.executor.planner.address)) {
    exposures.push_back({"--planner", planner});
  }
  exposures.push_back({"--listen-address", o.executor.listen_address});
  if (o.http_port >= 0) exposures.push_back({"--http-host", o.http_host});
  return dynapipe::rpc::RequireTokenOffLoopback(!o.executor.planner.token.empty(), absl::GetFlag(FLAGS_insecure),
                                                exposures);
}

// Runs the server until a signal or its own end; the process's exit code.
int Serve(const rt::executor::ExecutorServerOptions& o) {
  auto server = rt::executor::ExecutorServer::Start(o);
  if (!server.ok()) {
    spdlog::critical("{}", server.status().message());
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  while (!g_stop && !(*server)->done()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (g_stop) spdlog::info("signal received: stopping");
  (*server)->Shutdown();
  if (const absl::Status s = (*server)->Wait(); !s.ok()) {
    spdlog::critical("{}", s.message());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a peer that went away (a socket a failed job's peer closed)
  // is an error the caller sees, not the end of this daemon.
  std::signal(SIGPIPE, SIG_IGN);
  dynapipe::ParseFlags(argc, argv, "dynapipe-executor",
                       "dynapipe-executor: one per device; registers with the planner, takes ranks of "
                       "jobs, trains and reports.\n"
                       "example: dynapipe-executor --planner 10.0.0.5:50051 --device 0 --backend cuda "
                       "--token-file /etc/dynapipe/executor-0.token");
  const std::string name = "executor-" + std::to_string(absl::GetFlag(FLAGS_device));
  if (auto s = dynapipe::InitLogging({name, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_log_file)}); !s.ok()) {
    std::fprintf(stderr, "dynapipe-executor: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<rt::executor::ExecutorServerOptions> o = OptionsFromFlags();
  const absl::Status s = o.ok() ? CheckExposure(*o) : o.status();
  if (!s.ok()) {
    spdlog::critical("{}", s.message());
    return 2;
  }
  return Serve(*o);
}
