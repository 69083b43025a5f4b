#include "tests/hostile/feed_grpc.h"

#include <grpcpp/generic/generic_stub.h>

#include <catch2/catch.hpp>
#include <functional>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/rpc/auth.h"
#include "src/rpc/executor_credential.h"
#include "src/rpc/planner_client.h"
#include "src/rpc/status_conversion.h"
#include "tests/hostile/network_corpus.h"
#include "src/testing/raw_socket.h"

namespace dynapipe::testing::hostile {
namespace {

constexpr char kWire[] = "gRPC port: raw bytes, HTTP/1.1, broken HTTP/2, stalls";
constexpr char kAuth[] = "gRPC metadata: API token, executor credential";
constexpr char kSize[] = "gRPC message size, raw protobuf bodies";

}  // namespace

// Junk on the gRPC port is refused when the planner closes the connection or
// sends GOAWAY; if it does neither (it holds a stalled connection, or ignores
// a frame), it must keep serving other calls meanwhile, else it hangs.
void FeedGrpcWire(PlannerUnderTest& p, Tally& t) {
  constexpr absl::Duration kClose = absl::Seconds(2);  // grpc-core closes on junk within milliseconds
  for (const WireCase& c : GrpcWireCases()) {
    auto conn = RawConnection::Connect(p.port());
    REQUIRE(conn.ok());
    (*conn)->Send(c.bytes, absl::Now() + kClose);
    const Exchange e = (*conn)->Read(absl::Now() + (c.stalls ? absl::ZeroDuration() : kClose), HasGoaway);
    Result r;
    if (e.closed || e.complete) {
      r = {Outcome::kRefused, e.complete ? "GOAWAY" : "closed",
           absl::StrCat(e.complete ? "GOAWAY" : "closed", " (the planner sent: ", DescribeFrames(e.response), ")")};
    } else {
      proto::ListJobsResponse resp;
      const absl::Time t0 = absl::Now();
      const grpc::Status s = p.jobs().List(p.Context(kClose).get(), {}, &resp);
      const absl::Duration took = absl::Now() - t0;
      if (s.ok()) {
        r = {Outcome::kRefused, c.stalls ? "held; others served" : "ignored; others served",
             absl::StrCat("connection left open (the planner sent: ", DescribeFrames(e.response),
                          "); a List call meanwhile answered in ", absl::FormatDuration(absl::Trunc(took, absl::Microseconds(100))))};
      } else {
        r = {Outcome::kHang, "others starved",
             absl::StrCat("connection left open and a List call meanwhile failed: ", s.error_message())};
      }
    }
    conn->reset();
    if (!p.Healthy()) r = {Outcome::kCrash, "planner down", "the planner died or stopped answering /healthz"};
    t.Add(kWire, c.name, r);
  }
}

void FeedGrpcAuth(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base) {
  // A job of its own for Cancel (accepted by a bad token it would be cancelled).
  proto::SubmitJobRequest submit;
  *submit.mutable_spec() = base;
  submit.mutable_spec()->set_name("auth-target");
  proto::SubmitJobResponse submitted;
  REQUIRE(p.jobs().Submit(p.Context().get(), submit, &submitted).ok());
  const std::string job = submitted.job_id();
  constexpr absl::Duration kLimit = absl::Seconds(5);
  using Call = std::function<grpc::Status(grpc::ClientContext*)>;
  const std::vector<std::pair<std::string, Call>> methods = {
      {"JobService.Submit (a valid job)",
       [&](grpc::ClientContext* c) {
         proto::SubmitJobResponse r;
         const grpc::Status s = p.jobs().Submit(c, submit, &r);
         if (s.ok()) p.Cancel(r.job_id());
         return s;
       }},
      {"JobService.Get",
       [&](grpc::ClientContext* c) {
         proto::GetJobRequest q;
         q.set_job_id(job);
         proto::JobStatus r;
         return p.jobs().Get(c, q, &r);
       }},
      {"JobService.List", [&](grpc::ClientContext* c) {
         proto::ListJobsResponse r;
         return p.jobs().List(c, {}, &r);
       }},
      {"JobService.Cancel",
       [&](grpc::ClientContext* c) {
         proto::CancelJobRequest q;
         q.set_job_id(job);
         proto::CancelJobResponse r;
         return p.jobs().Cancel(c, q, &r);
       }},
      {"JobService.Watch",
       [&](grpc::ClientContext* c) {
         proto::WatchJobRequest q;
         q.set_job_id(job);
         auto reader = p.jobs().Watch(c, q);
         proto::JobEvent e;
         if (reader->Read(&e)) {
           c->TryCancel();
           (void)reader->Finish();
           return grpc::Status::OK;  // an event reached the caller
         }
         return reader->Finish();
       }},
      {"PlanService.FetchPlan",
       [&](grpc::ClientContext* c) {
         proto::FetchPlanRequest q;
         q.set_job_id(job);
         proto::FetchPlanResponse r;
         return p.plans().FetchPlan(c, q, &r);
       }},
      {"PlanService.ReportIteration",
       [&](grpc::ClientContext* c) {
         proto::IterationReport q;
         q.set_job_id(job);
         q.set_iteration(0);
         proto::ReportIterationResponse r;
         return p.plans().ReportIteration(c, q, &r);
       }},
      {"ExecutorRegistry.Register",
       [&](grpc::ClientContext* c) {
         proto::RegisterExecutorRequest q;
         q.set_node("intruder");
         proto::RegisterExecutorResponse r;
         return p.registry().Register(c, q, &r);
       }},
      {"ExecutorRegistry.Heartbeat",
       [&](grpc::ClientContext* c) {
         proto::HeartbeatRequest q;
         q.set_executor_id("exec-intruder-0-0000000000000000");
         proto::HeartbeatResponse r;
         return p.registry().Heartbeat(c, q, &r);
       }},
      {"ExecutorRegistry.List", [&](grpc::ClientContext* c) {
         proto::ListExecutorsResponse r;
         return p.registry().List(c, {}, &r);
       }},
      {"Bootstrap.Set",
       [&](grpc::ClientContext* c) {
         proto::BootstrapSetRequest q;
         q.set_job_id(job);
         q.set_key("nccl-id");
         q.set_value("forged");
         proto::BootstrapSetResponse r;
         return p.bootstrap().Set(c, q, &r);
       }},
      {"Bootstrap.Get",
       [&](grpc::ClientContext* c) {
         proto::BootstrapGetRequest q;
         q.set_job_id(job);
         q.set_key("nccl-id");
         proto::BootstrapGetResponse r;
         return p.bootstrap().Get(c, q, &r);
       }},
  };
  const std::string& token = p.token();
  const std::vector<std::pair<std::string, std::string>> tokens = {  // "authorization" values; "" = none
      {"no token", ""},
      {"a wrong token", "Bearer wrong-token"},
      {"the token's first half", "Bearer " + token.substr(0, token.size() / 2)},
      {"the token plus one byte", "Bearer " + token + "x"},
      {"the token under another scheme", "Basic " + token},
      {"the token without a scheme", token},
      {"an empty bearer", "Bearer "},
      {"8 KiB of junk", "Bearer " + std::string(8192, 'j')},
  };
  for (const auto& [what, value] : tokens) {
    for (const auto& [method, call] : methods) {
      grpc::ClientContext ctx;
      if (!value.empty()) ctx.AddMetadata("authorization", value);
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kLimit));
      const absl::Time t0 = absl::Now();
      const grpc::Status s = call(&ctx);
      t.Add(kAuth, absl::StrCat(method, ": ", what), p.Classify(s, absl::Now() - t0, kLimit));
    }
  }
  // Executor identity: the token is right, the credential is not.
  std::vector<proto::RegisterExecutorResponse> execs(2);
  for (int i = 0; i < 2; ++i) {
    proto::RegisterExecutorRequest q;
    q.set_node("hostile");
    q.set_device_index(i);
    // The oversized-metadata cases above make the planner close the shared
    // connection (as it should): a call racing that close sees UNAVAILABLE,
    // which a real client retries.
    grpc::Status registered;
    for (int attempt = 0; attempt < 5; ++attempt) {
      registered = p.registry().Register(p.Context().get(), q, &execs[i]);
      if (registered.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    INFO("Register: " << registered.error_code() << " " << registered.error_message());
    REQUIRE(registered.ok());
  }
  const std::string& id = execs[0].executor_id();
  const std::vector<std::pair<std::string, std::string>> credentials = {
      {"an empty credential", ""},
      {"junk", "junk"},
      {"a lone colon", ":"},
      {"three fields", "a:b:c"},
      {"an unknown executor", "exec-nobody-0-0000000000000000:" + std::string(64, '0')},
      {"a registered executor, wrong secret", id + ":" + std::string(64, '0')},
      {"a registered executor, another executor's secret", id + ":" + execs[1].executor_secret()},
      {"a registered executor, no secret", id},
      {"4 KiB of junk", std::string(4096, 'k')},
  };
  for (const auto& [what, value] : credentials) {
    for (const auto& [method, call] : methods) {
      if (method != "ExecutorRegistry.Heartbeat" && method != "PlanService.ReportIteration" &&
          method != "Bootstrap.Set" && method != "Bootstrap.Get") {
        continue;
      }
      grpc::ClientContext ctx;
      rpc::AttachToken(&ctx, token);
      ctx.AddMetadata(rpc::kExecutorCredentialKey, value);
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kLimit));
      const absl::Time t0 = absl::Now();
      const grpc::Status s = method == "ExecutorRegistry.Heartbeat"
                                 ? [&] {
                                     proto::HeartbeatRequest q;
                                     q.set_executor_id(id);
                                     proto::HeartbeatResponse r;
                                     return p.registry().Heartbeat(&ctx, q, &r);
                                   }()
                                 : call(&ctx);
      t.Add(kAuth, absl::StrCat(method, ": ", what), p.Classify(s, absl::Now() - t0, kLimit));
    }
  }
  p.Cancel(job);
}

void FeedGrpcSize(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base) {
  auto submit_name = [&](size_t bytes, bool with_token) {
    proto::SubmitJobRequest req;
    *req.mutable_spec() = base;
    req.mutable_spec()->set_name(std::string(bytes, 'n'));
    proto::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    if (with_token) rpc::AttachToken(&ctx, p.token());
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
    const absl::Time t0 = absl::Now();
    const grpc::Status s = p.jobs().Submit(&ctx, req, &resp);
    if (s.ok()) p.Cancel(resp.job_id());
    return p.Classify(s, absl::Now() - t0);
  };
  {
    rpc::PlannerClient::Options o;
    o.address = p.address();
    o.token = p.token();
    o.timeout = kDeadline;
    auto client = rpc::PlannerClient::Connect(o);
    REQUIRE(client.ok());
    proto::JobSpec spec = base;
    spec.set_name(std::string(300u << 20, 'n'));
    const absl::Time t0 = absl::Now();
    const absl::StatusOr<std::string> id = (*client)->Submit(spec);
    const Result r = p.Classify(rpc::ToGrpc(id.status()), absl::Now() - t0);
    if (id.ok()) p.Cancel(*id);
    t.Add(kSize, "a 300 MB name through rpc::PlannerClient", r);
  }
  t.Add(kSize, "a 300 MB name, with the token", submit_name(300u << 20, true));
  t.Add(kSize, "a 64 MB name, with the token", submit_name(64u << 20, true));
  t.Add(kSize, "a 64 MB name, without the token", submit_name(64u << 20, false));
  t.Add(kSize, "a request 1 byte over the 4 MiB limit", submit_name(rpc::kMaxPlannerRequestBytes, true));
  t.Add(kSize, "a 3.9 MB name (under the message limit)", submit_name(3900000, true));
  auto big = [&](const std::string& name, const std::function<grpc::Status(grpc::ClientContext*)>& call) {
    auto ctx = p.Context();
    const absl::Time t0 = absl::Now();
    const grpc::Status s = call(ctx.get());
    t.Add(kSize, name, p.Classify(s, absl::Now() - t0));
  };
  const std::string mb3(3u << 20, 'x');
  big("IterationReport with a 64 MB error", [&](grpc::ClientContext* c) {
    proto::IterationReport q;
    q.set_job_id("1");
    q.set_error(std::string(64u << 20, 'e'));
    proto::ReportIterationResponse r;
    return p.plans().ReportIteration(c, q, &r);
  });
  big("Bootstrap.Set with a 5 MiB value", [&](grpc::ClientContext* c) {
    proto::BootstrapSetRequest q;
    q.set_job_id("1");
    q.set_key("k");
    q.set_value(std::string(5u << 20, 'v'));
    proto::BootstrapSetResponse r;
    return p.bootstrap().Set(c, q, &r);
  });
  big("Register with a 3 MB node name", [&](grpc::ClientContext* c) {
    proto::RegisterExecutorRequest q;
    q.set_node(mb3);
    proto::RegisterExecutorResponse r;
    return p.registry().Register(c, q, &r);
  });
  big("Get with a 3 MB job id", [&](grpc::ClientContext* c) {
    proto::GetJobRequest q;
    q.set_job_id(mb3);
    proto::JobStatus r;
    return p.jobs().Get(c, q, &r);
  });
  big("FetchPlan with a 3 MB job id", [&](grpc::ClientContext* c) {
    proto::FetchPlanRequest q;
    q.set_job_id(mb3);
    proto::FetchPlanResponse r;
    return p.plans().FetchPlan(c, q, &r);
  });
  big("Heartbeat with a 3 MB executor id", [&](grpc::ClientContext* c) {
    proto::HeartbeatRequest q;
    q.set_executor_id(mb3);
    proto::HeartbeatResponse r;
    return p.registry().Heartbeat(c, q, &r);
  });
  // Bodies that are not the request message at all.
  grpc::GenericStub generic(p.channel());
  for (const char* method : {"/dynapipe.proto.JobService/Submit", "/dynapipe.proto.JobService/Get",
                             "/dynapipe.proto.JobService/Cancel", "/dynapipe.proto.PlanService/FetchPlan"}) {
    for (const WireCase& c : ProtobufJunk(10)) {
      grpc::Slice slice(c.bytes.data(), c.bytes.size());
      grpc::ByteBuffer request(&slice, 1), response;
      auto ctx = p.Context(absl::Seconds(5));
      std::promise<grpc::Status> done;
      const absl::Time t0 = absl::Now();
      generic.UnaryCall(ctx.get(), method, grpc::StubOptions(), &request, &response,
                        [&](grpc::Status s) { done.set_value(std::move(s)); });
      const grpc::Status s = done.get_future().get();
      t.Add(kSize, absl::StrCat(std::string(method).substr(16), ": ", c.name), p.Classify(s, absl::Now() - t0, absl::Seconds(5)));
    }
  }
}

}  // namespace dynapipe::testing::hostile
