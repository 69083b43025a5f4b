#include "planner/service/planner_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/resource_quota.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(Options options) {
  std::unique_ptr<PlannerServer> s(new PlannerServer());
  s->store_ = std::make_unique<store::RedisPlanStore>(options.redis, options.redis_prefix);
  s->service_ = std::make_unique<PlannerService>(s->store_.get(), options.service);
  s->jobs_ = std::make_unique<JobServiceImpl>(s->service_.get(), options.token);
  s->plans_ = std::make_unique<PlanServiceImpl>(s->service_.get(), options.token);
  s->registry_ = std::make_unique<ExecutorRegistryImpl>(s->service_.get(), options.token);
  s->bootstrap_ = std::make_unique<BootstrapImpl>(s->service_.get(), options.token);
  // A call without the token is refused on its headers, before its message is read.
  ASSIGN_OR_RETURN(auto creds, rpc::ServerCredentials(options.tls, options.token));
  // Server reflection (grpc.reflection.v1alpha), for grpcurl and clients
  // without our .proto files. Behind the same token as every call: the
  // credentials check it on each call's headers, whatever the service. (The
  // library registers its plugin for every server of the process once
  // loaded; this call is what links it.)
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // No SO_REUSEPORT: a second planner on a taken port must fail, not split
  // the port's connections with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, creds, &s->port_);
  builder.RegisterService(s->jobs_.get());
  builder.RegisterService(s->plans_.get());
  builder.RegisterService(s->registry_.get());
  builder.RegisterService(s->bootstrap_.get());
  builder.SetMaxReceiveMessageSize(rpc::kMaxPlannerRequestBytes);
  grpc::ResourceQuota quota("dynapipe-planner");
  quota.Resize(rpc::kPlannerReceiveQuotaBytes);
  builder.SetResourceQuota(quota);
  builder.SetMaxSendMessageSize(rpc::kMaxPlannerResponseBytes);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen, " (taken, or not ours)"));
  }
  if (options.http_port >= 0) {
    http::StatusServer::Options h;
    h.host = options.http_host;
    h.port = options.http_port;
    PlannerService* svc = s->service_.get();
    h.health = [svc] { return svc->HealthProblem(); };
    h.status = [svc] { return svc->StatusJson(); };
    h.metrics = [svc] { return svc->MetricsText(); };
    ASSIGN_OR_RETURN(s->http_, http::StatusServer::Start(h));
  }
  s->service_->Start();
  spdlog::info("dynapipe-planner {} serving gRPC on port {}, status on port {}, redis {}:{}", s->service_->owner(),
               s->port_, s->http_port(), options.redis.host, options.redis.port);
  return s;
}

void PlannerServer::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Waiting calls are answered by the service's Stop; give them a moment.
  if (service_) service_->Stop();
  if (server_) {
    // Calls in progress finish, unless the store keeps them waiting: after
    // the grace their store calls are cut short (UNAVAILABLE, which clients
    // retry against the next planner). gRPC waits for every handler to return.
    Mutex cut_mu;
    bool drained = false;
    std::thread cutter([&] {
      MutexLock lock(&cut_mu);
      if (!cut_mu.AwaitWithDeadline([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return drained; },
                                    absl::Now() + PlannerService::kStopGrace)) {
        store_->Shutdown();
      }
    });
    server_->Shutdown(absl::ToChronoTime(absl::Now() + 2 * PlannerService::kStopGrace));
    {
      MutexLock lock(&cut_mu);
      drained = true;
    }
    cutter.join();
  }
  if (http_) http_->Shutdown();
  spdlog::info("dynapipe-planner stopped");
}

PlannerServer::~PlannerServer() { Shutdown(); }

}  // namespace dynapipe::planner::service
