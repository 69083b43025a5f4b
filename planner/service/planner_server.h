#pragma once

// The planner daemon as a server object: plan store, PlannerService, gRPC
// services and the HTTP status endpoint. Tests start it on port 0.

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "planner/service/grpc_services.h"
#include "planner/service/planner_service.h"
#include "src/http/status_server.h"
#include "src/rpc/auth.h"
#include "src/store/redis_plan_store.h"
#include "src/rpc/defaults.h"

namespace dynapipe::planner::service {

class PlannerServer {
 public:
  struct Options {
    std::string listen = "127.0.0.1:0";  // gRPC address; port 0 picks a free one
    std::string http_host{rpc::kLoopbackHost};
    int http_port = 0;  // -1: no status endpoint
    store::RedisOptions redis;
    std::string redis_prefix = "dynapipe:";
    std::string token;  // empty: no authentication
    rpc::TlsFiles tls;
    ServiceOptions service;
  };

  static absl::StatusOr<std::unique_ptr<PlannerServer>> Start(Options options);
  ~PlannerServer();

  int port() const { return port_; }
  int http_port() const { return http_ ? http_->port() : -1; }
  PlannerService& service() { return *service_; }
  // Stops taking calls, answers waiting ones, stops planning (in-flight
  // iterations finish or leave their lease to expire).
  void Shutdown();

 private:
  PlannerServer() = default;
  std::unique_ptr<store::RedisPlanStore> store_;
  std::unique_ptr<PlannerService> service_;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<PlanServiceImpl> plans_;
  std::unique_ptr<ExecutorRegistryImpl> registry_;
  std::unique_ptr<BootstrapImpl> bootstrap_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<http::StatusServer> http_;
  int port_ = 0;
  Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown started
};

}  // namespace dynapipe::planner::service
