#include "tests/hostile/feed_network.h"

#include <catch2/catch.hpp>
#include <limits>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/store/keys.h"
#include "src/store/redis_client.h"
#include "tests/hostile/data_root.h"
#include "tests/hostile/network_corpus.h"
#include "src/testing/raw_socket.h"

namespace dynapipe::testing::hostile {
namespace {

constexpr char kPlans[] = "Plans stored in Redis, plan requests → `FetchPlan`";
constexpr char kHttp[] = "HTTP status endpoint (raw sockets)";

// What follows any "100 Continue" interim responses.
std::string FinalResponse(std::string r) {
  while (HttpStatus(r) == 100 && HttpResponseComplete(r)) r = r.substr(r.find("\r\n\r\n") + 4);
  return r;
}

Result HttpResult(PlannerUnderTest& p, const Exchange& e) {
  const std::string r = FinalResponse(e.response);
  const int status = HttpStatus(r);
  if (!p.Healthy()) return {Outcome::kCrash, "planner down", "the planner died or /healthz stopped answering"};
  if (status >= 400) return {Outcome::kRefused, absl::StrCat("HTTP ", status), FirstLine(r)};
  if (status >= 100) return {Outcome::kAccepted, absl::StrCat("HTTP ", status), FirstLine(r)};
  if (e.closed) return {Outcome::kRefused, "closed", "connection closed without a response"};
  return {Outcome::kHang, "no answer", absl::StrCat("no response or close within ", absl::FormatDuration(kDeadline))};
}

}  // namespace

void FeedStoredPlans(PlannerUnderTest& p, Tally& t, int redis_port, const proto::JobSpec& base) {
  // Two jobs with plans ready for iteration 0 (nobody fetches them: they stay).
  auto submit = [&](const std::string& name) {
    proto::SubmitJobRequest req;
    *req.mutable_spec() = base;
    req.mutable_spec()->set_name(name);
    proto::SubmitJobResponse resp;
    REQUIRE(p.jobs().Submit(p.Context().get(), req, &resp).ok());
    return resp.job_id();
  };
  const std::string job = submit("plans-a"), other = submit("plans-b");
  auto ready = [&](const std::string& j, int64_t iteration) {
    return Eventually(
        [&] {
          proto::GetJobRequest req;
          req.set_job_id(j);
          proto::JobStatus st;
          return p.jobs().Get(p.Context().get(), req, &st).ok() && st.plans_ready() >= iteration;
        },
        absl::Seconds(60));
  };
  REQUIRE(ready(job, 1));
  REQUIRE(ready(other, 0));
  store::RedisOptions o;
  o.port = redis_port;
  store::RedisClient redis(o);
  const store::Keys keys;
  auto get = [&](const std::string& key) {
    auto r = redis.Command({"GET", key});
    REQUIRE(r.ok());
    REQUIRE(!r->is_nil());
    return r->str;
  };
  const std::string slot = keys.Plan(job, 0, 0);
  const std::string plan = get(slot), rank1 = get(keys.Plan(job, 0, 1)), iter1 = get(keys.Plan(job, 1, 0)),
                    foreign = get(keys.Plan(other, 0, 0));
  constexpr absl::Duration kWait = absl::Seconds(5);  // FetchPlan waits this long for a plan not stored
  auto fetch = [&](const std::string& j, int64_t iteration, int rank) {
    proto::FetchPlanRequest req;
    req.set_job_id(j);
    req.set_iteration(iteration);
    req.set_rank(rank);
    proto::FetchPlanResponse resp;
    const absl::Time t0 = absl::Now();
    const grpc::Status s = p.plans().FetchPlan(p.Context(kWait).get(), req, &resp);
    return p.Classify(s, absl::Now() - t0, kWait);
  };
  const Result intact = fetch(job, 0, 0);
  t.AddControl(kPlans, "the stored plan, untouched", intact.outcome == Outcome::kAccepted,
               intact.code + ": " + intact.message);

  std::vector<std::pair<std::string, std::string>> stored = {
      {"empty value", ""},
      {"1 random byte", RandomBytes(1, 71)},
      {"16 random bytes", RandomBytes(16, 72)},
      {"1 KiB of random bytes", RandomBytes(1024, 73)},
      {"64 KiB of random bytes", RandomBytes(65536, 74)},
      {"the plan with its checksum cleared",
       [&] {
         proto::ExecutionPlan e;
         e.ParseFromString(plan);
         e.clear_checksum();
         return e.SerializeAsString();
       }()},
      {"the plan plus an unknown field", plan + std::string("\xf8\x07\x01", 3)},
      {"the plan of rank 1 in rank 0's slot", rank1},
      {"the plan of iteration 1 in iteration 0's slot", iter1},
      {"another job's plan in this job's slot", foreign},
  };
  for (size_t n : {size_t{1}, plan.size() / 4, plan.size() / 2, plan.size() - 9, plan.size() - 1}) {
    stored.push_back({absl::StrCat("the plan truncated to ", n, " of ", plan.size(), " bytes"), plan.substr(0, n)});
  }
  // A flip that decodes to the same plan is no corruption (e.g. the upper
  // bytes of -1's ten-byte varint, which an int32 field drops): take the
  // next byte then.
  auto same_plan = [&](const std::string& bytes) {
    proto::ExecutionPlan a, b;
    return a.ParseFromString(plan) && b.ParseFromString(bytes) && a.SerializeAsString() == b.SerializeAsString();
  };
  for (size_t i = 0; i < 8; ++i) {
    std::string b;
    size_t at = 1 + i * (plan.size() - 2) / 7;
    for (;; ++at) {
      b = plan;
      b[at] = static_cast<char>(b[at] ^ 0x01);
      if (at + 1 >= plan.size() || !same_plan(b)) break;
    }
    stored.push_back({absl::StrCat("the plan with byte ", at, " of ", plan.size(), " flipped"), b});
  }
  for (const auto& [name, bytes] : stored) {
    REQUIRE(redis.Command({"SET", slot, bytes}).ok());
    t.Add(kPlans, name, fetch(job, 0, 0));
  }
  REQUIRE(redis.Command({"DEL", slot}).ok());
  REQUIRE(redis.Command({"HSET", slot, "field", "value"}).ok());
  t.Add(kPlans, "a Redis hash where the plan was", fetch(job, 0, 0));
  REQUIRE(redis.Command({"DEL", slot}).ok());
  t.Add(kPlans, "the plan gone from Redis, its iteration marked planned (as after plan_ttl, 1 h)", fetch(job, 0, 0));
  REQUIRE(redis.Command({"SET", slot, plan}).ok());
  const Result restored = fetch(job, 0, 0);
  t.AddControl(kPlans, "the stored plan, restored", restored.outcome == Outcome::kAccepted,
               restored.code + ": " + restored.message);

  const std::vector<std::tuple<std::string, std::string, int64_t, int>> requests = {
      {"iteration -1", job, -1, 0},
      {"rank -1", job, 0, -1},
      {"rank 2 of a 2-rank job", job, 0, 2},
      {"rank 2^31-1", job, 0, std::numeric_limits<int>::max()},
      {"iteration 2^62", job, int64_t{1} << 62, 0},
      {"iteration 4 of a 4-iteration job", job, 4, 0},
      {"an empty job id", "", 0, 0},
      {"a job that does not exist", "no-such-job", 0, 0},
      {"a job id with a newline and a Redis pattern", "1\n*", 0, 0},
      {"a job id naming another key (\"1:spec\")", job + ":spec", 0, 0},
  };
  for (const auto& [name, j, iteration, rank] : requests) t.Add(kPlans, "request: " + name, fetch(j, iteration, rank));
}

void FeedHttp(PlannerUnderTest& p, Tally& t) {
  auto final_complete = [](const std::string& r) {
    const std::string f = FinalResponse(r);
    return HttpStatus(f) != 100 && HttpResponseComplete(f);
  };
  std::vector<WireCase> stalls;
  for (const WireCase& c : HttpCases()) {
    if (c.stalls) {
      stalls.push_back(c);
      continue;
    }
    t.Add(kHttp, c.name, HttpResult(p, SendAndRead(p.http_port(), c.bytes, kDeadline, final_complete)));
  }
  // Stalled requests, all at once and 8 copies each (more than a few workers'
  // worth): each must be dropped by the server, and /healthz answer meanwhile.
  struct Stall {
    std::string name;
    std::unique_ptr<RawConnection> conn;
    Exchange e;
  };
  std::vector<Stall> held;
  const absl::Time deadline = absl::Now() + kDeadline;
  for (const WireCase& c : stalls) {
    for (int copy = 0; copy < 8; ++copy) {
      auto conn = RawConnection::Connect(p.http_port());
      REQUIRE(conn.ok());
      (*conn)->Send(c.bytes, deadline);
      held.push_back({copy == 0 ? c.name : "", std::move(*conn), {}});
    }
  }
  const bool healthz_meanwhile = HealthzOk(p.http_port(), absl::Seconds(10));
  std::vector<std::thread> readers;
  for (Stall& s : held) readers.emplace_back([&s, deadline, &final_complete] { s.e = s.conn->Read(deadline, final_complete); });
  for (auto& r : readers) r.join();
  for (Stall& s : held) {
    if (s.name.empty()) continue;
    Result r = HttpResult(p, s.e);
    if (!healthz_meanwhile && r.outcome == Outcome::kRefused) {
      r = {Outcome::kHang, "healthz starved", "GET /healthz did not answer while stalled connections were held"};
    }
    t.Add(kHttp, s.name + " (8 at once)", r);
  }
}

}  // namespace dynapipe::testing::hostile
