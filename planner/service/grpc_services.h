#pragma once

// Thin gRPC adapters (callback API) over PlannerService: check the token,
// convert statuses, never block a gRPC thread (waits complete later).
// Executor-side calls also pass PlannerService's identity checks first:
// Heartbeat, ReportIteration and Bootstrap Set/Get need the caller's
// x-dynapipe-executor credential (src/rpc/executor_credential.h). FetchPlan
// needs only the token: plans hold nothing a token holder may not read, and
// the CLI and tests fetch them.

#include <memory>
#include <string>

#include "planner/service/planner_service.h"
#include "proto/services.grpc.pb.h"

namespace dynapipe::planner::service {

class JobServiceImpl : public proto::JobService::CallbackService {
 public:
  JobServiceImpl(PlannerService* s, std::string token) : s_(s), token_(std::move(token)) {}
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const proto::SubmitJobRequest* req,
                                   proto::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const proto::GetJobRequest* req,
                                proto::JobStatus* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const proto::ListJobsRequest* req,
                                 proto::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx, const proto::CancelJobRequest* req,
                                   proto::CancelJobResponse* resp) override;
  grpc::ServerWriteReactor<proto::JobEvent>* Watch(grpc::CallbackServerContext* ctx,
                                                   const proto::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* GetIterations(grpc::CallbackServerContext* ctx, const proto::GetIterationsRequest* req,
                                          proto::GetIterationsResponse* resp) override;
  grpc::ServerUnaryReactor* GetIteration(grpc::CallbackServerContext* ctx, const proto::GetIterationRequest* req,
                                         proto::GetIterationResponse* resp) override;

 private:
  PlannerService* s_;
  std::string token_;
};

class PlanServiceImpl : public proto::PlanService::CallbackService {
 public:
  PlanServiceImpl(PlannerService* s, std::string token) : s_(s), token_(std::move(token)) {}
  grpc::ServerUnaryReactor* FetchPlan(grpc::CallbackServerContext* ctx, const proto::FetchPlanRequest* req,
                                      proto::FetchPlanResponse* resp) override;
  grpc::ServerUnaryReactor* ReportIteration(grpc::CallbackServerContext* ctx, const proto::IterationReport* req,
                                            proto::ReportIterationResponse* resp) override;

 private:
  PlannerService* s_;
  std::string token_;
};

class ExecutorRegistryImpl : public proto::ExecutorRegistry::CallbackService {
 public:
  ExecutorRegistryImpl(PlannerService* s, std::string token) : s_(s), token_(std::move(token)) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const proto::RegisterExecutorRequest* req,
                                     proto::RegisterExecutorResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const proto::HeartbeatRequest* req,
                                      proto::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const proto::ListExecutorsRequest* req,
                                 proto::ListExecutorsResponse* resp) override;

 private:
  PlannerService* s_;
  std::string token_;
};

class BootstrapImpl : public proto::Bootstrap::CallbackService {
 public:
  BootstrapImpl(PlannerService* s, std::string token) : s_(s), token_(std::move(token)) {}
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const proto::BootstrapSetRequest* req,
                                proto::BootstrapSetResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const proto::BootstrapGetRequest* req,
                                proto::BootstrapGetResponse* resp) override;

 private:
  PlannerService* s_;
  std::string token_;
};

}  // namespace dynapipe::planner::service
