// dynapipe-planner: plans jobs' iterations ahead of training into Redis and
// serves them to executors over gRPC. Flags only name this process's identity
// and addresses; job tunables come with each job.
#include <csignal>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner/service/planner_server.h"
#include "src/common/flags.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"
#include "src/rpc/defaults.h"
#include "src/rpc/exposure.h"

ABSL_FLAG(std::string, listen, std::string(dynapipe::rpc::kDefaultPlannerAddress),
          "gRPC address (host:port; port 0 picks one)");
ABSL_FLAG(int, http_port, dynapipe::rpc::kPlannerStatusPort, "status endpoint port (0 picks one, -1 disables)");
ABSL_FLAG(std::string, http_host, dynapipe::planner::service::PlannerServer::Options().http_host,
          "status endpoint address");
ABSL_FLAG(std::string, redis, absl::StrCat("127.0.0.1:", dynapipe::store::kDefaultRedisPort), "Redis host:port");
ABSL_FLAG(std::string, redis_password_file, "",
          "file (mode 0600) holding the Redis password (else $DYNAPIPE_REDIS_PASSWORD)");
ABSL_FLAG(std::string, redis_prefix, dynapipe::planner::service::PlannerServer::Options().redis_prefix,
          "prefix of every Redis key");
ABSL_FLAG(std::string, token_file, "",
          "file (mode 0600) holding the shared API token; without one, only loopback addresses unless --insecure");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain (enables TLS with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(std::string, data_root, "", "directory that relative dataset paths resolve against");
ABSL_FLAG(int, planning_threads, dynapipe::planner::service::ServiceOptions().planning_threads,
          "planning worker threads");
ABSL_FLAG(int, lease_ttl_ms, absl::ToInt64Milliseconds(dynapipe::planner::service::ServiceOptions().lease_ttl),
          "lease on an iteration being planned; another planner takes over after it");
ABSL_FLAG(int, heartbeat_timeout_ms,
          absl::ToInt64Milliseconds(dynapipe::planner::service::ServiceOptions().heartbeat_timeout),
          "executors silent this long are lost and their job fails");
ABSL_FLAG(int64_t, progress_timeout_s,
          absl::ToInt64Seconds(dynapipe::planner::service::ServiceOptions().progress_timeout),
          "a running job whose completed iterations do not advance this long fails");
ABSL_FLAG(std::string, port_file, "", "write the chosen gRPC and HTTP ports here (\"grpc http\")");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, log_file, "", "also log to this file");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  // A write to a peer that went away (a socket a failed job's peer closed)
  // is an error the caller sees, not the end of this daemon.
  std::signal(SIGPIPE, SIG_IGN);
  dynapipe::ParseFlags(argc, argv, "dynapipe-planner",
                       "dynapipe-planner: plans jobs ahead into Redis and serves them to executors "
                       "(gRPC), with /healthz, /status and /metrics.\n"
                       "example: dynapipe-planner --listen 0.0.0.0:50051 --redis 127.0.0.1:6379 "
                       "--token-file /etc/dynapipe/token");
  using dynapipe::planner::service::PlannerServer;
  if (auto s = dynapipe::InitLogging({"planner", absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_log_file)}); !s.ok()) {
    std::fprintf(stderr, "dynapipe-planner: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  PlannerServer::Options o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.http_port = absl::GetFlag(FLAGS_http_port);
  o.http_host = absl::GetFlag(FLAGS_http_host);
  std::vector<std::string> redis = absl::StrSplit(absl::GetFlag(FLAGS_redis), ':');
  if (redis.size() != 2 || !absl::SimpleAtoi(redis[1], &o.redis.port)) {
    spdlog::critical("--redis: expected host:port, got \"{}\"", absl::GetFlag(FLAGS_redis));
    return 2;
  }
  o.redis.host = redis[0];
  auto password = dynapipe::store::ReadRedisPassword(absl::GetFlag(FLAGS_redis_password_file));
  auto token = dynapipe::rpc::ReadToken(absl::GetFlag(FLAGS_token_file));
  for (const absl::Status& s : {dynapipe::Annotate(password.status(), "--redis-password-file"),
                                dynapipe::Annotate(token.status(), "--token-file")}) {
    if (!s.ok()) {
      spdlog::critical("{}", s.message());
      return 2;
    }
  }
  // Without a token, serve only this machine unless told --insecure.
  std::vector<dynapipe::rpc::Exposure> exposures = {{"--listen", o.listen}};
  if (o.http_port >= 0) exposures.push_back({"--http-host", o.http_host});
  if (auto s = dynapipe::rpc::RequireTokenOffLoopback(!token->empty(), absl::GetFlag(FLAGS_insecure), exposures);
      !s.ok()) {
    spdlog::critical("{}", s.message());
    return 2;
  }
  o.redis.password = *password;
  o.redis_prefix = absl::GetFlag(FLAGS_redis_prefix);
  o.token = *token;
  o.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key = absl::GetFlag(FLAGS_tls_key);
  o.service.data_root = absl::GetFlag(FLAGS_data_root);
  o.service.planning_threads = absl::GetFlag(FLAGS_planning_threads);
  o.service.lease_ttl = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ttl_ms));
  o.service.heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  if (absl::GetFlag(FLAGS_progress_timeout_s) < 1) {
    spdlog::critical("--progress-timeout-s: must be at least 1");
    return 2;
  }
  o.service.progress_timeout = absl::Seconds(absl::GetFlag(FLAGS_progress_timeout_s));
  auto server = PlannerServer::Start(o);
  if (!server.ok()) {
    spdlog::critical("{}", server.status().message());
    return 1;
  }
  if (const std::string pf = absl::GetFlag(FLAGS_port_file); !pf.empty()) {
    std::ofstream(pf + ".tmp") << (*server)->port() << " " << (*server)->http_port() << "\n";
    std::rename((pf + ".tmp").c_str(), pf.c_str());
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("signal received: draining");
  (*server)->Shutdown();
  return 0;
}
