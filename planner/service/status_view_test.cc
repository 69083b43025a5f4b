// StatusView: the /status document, byte for byte, and which ended jobs it
// shows; /metrics series of active jobs.
#include "planner/service/status_view.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "src/store/memory_plan_store.h"

namespace dynapipe::planner::service {
namespace {

using Catch::Matchers::Contains;

proto::JobStatus JobOf(const std::string& id, proto::JobState::Value state) {
  proto::JobStatus s;
  s.set_job_id(id);
  s.mutable_spec()->set_name("n\"" + id);
  s.mutable_spec()->set_iterations(10);
  s.set_state(state);
  s.set_iterations_done(4);
  s.set_plans_ready(5);
  s.set_last_iteration_ms(12.3456);
  s.set_predicted_iteration_ms(11);
  return s;
}

struct View {
  View() : runtimes(&store, "/"), view(&metrics, &runtimes) {}
  store::MemoryPlanStore store;
  JobRuntimes runtimes;
  http::Metrics metrics;
  StatusView view;
};

TEST_CASE("The status document lists jobs and executors in one fixed form", "[status]") {
  View v;
  StatusInputs in;
  in.jobs = {JobOf("2", proto::JobState::running), JobOf("1", proto::JobState::succeeded)};
  in.jobs[0].set_error("line\nbreak");
  proto::ExecutorRecord e;
  e.set_executor_id("exec-a-0-ff");
  e.mutable_info()->set_node("a");
  e.set_last_heartbeat_unix_ms(900);
  e.mutable_assignment()->set_job_id("2");
  e.mutable_assignment()->set_rank(1);
  in.executors = {e};
  in.now_ms = 1000;
  in.owner = "host-1";
  in.store_id = "s1";
  in.stale_ms = 0;
  CHECK(v.view.Json(in) ==
        R"({"daemon":"dynapipe-planner","owner":"host-1","healthy":true,"redis_errors":0,"store_id":"s1",)"
        R"("store_data_lost":0,"stale_ms":0,"notice":"","jobs":[)"
        R"({"job_id":"2","name":"n\"2","state":"running","iterations":10,"iterations_done":4,"plans_ready":5,)"
        R"("plans_ahead":2,"last_iteration_ms":12.346,"predicted_iteration_ms":11.000,"error":"line\nbreak"},)"
        R"({"job_id":"1","name":"n\"1","state":"succeeded","iterations":10,"iterations_done":4,"plans_ready":5,)"
        R"("plans_ahead":2,"last_iteration_ms":12.346,"predicted_iteration_ms":11.000,"error":""}],)"
        R"("ended_jobs_not_shown":0,"executors":[{"executor_id":"exec-a-0-ff","node":"a","device":0,)"
        R"("last_heartbeat_ms_ago":100,"lost":false,"job_id":"2","rank":1}]})");
}

TEST_CASE("Of the ended jobs the status shows the newest fifty", "[status]") {
  View v;
  StatusInputs in;
  for (int i = 1; i <= 60; ++i) in.jobs.push_back(JobOf(absl::StrCat(i), proto::JobState::failed));
  in.jobs.push_back(JobOf("61", proto::JobState::pending));
  const std::string json = v.view.Json(in);
  CHECK_THAT(json, Contains(R"("ended_jobs_not_shown":10)"));
  CHECK_THAT(json, Contains(R"("job_id":"61")"));
  CHECK_THAT(json, Contains(R"("job_id":"11")"));
  CHECK_THAT(json, !Contains(R"("job_id":"10")"));
}

TEST_CASE("Metrics carry the series of active jobs only", "[status]") {
  View v;
  StatusInputs in;
  in.jobs = {JobOf("3", proto::JobState::running), JobOf("4", proto::JobState::cancelled)};
  in.redis_errors = 2;
  const std::string text = v.view.MetricsText(in);
  CHECK_THAT(text, Contains("dynapipe_jobs_running 1\n"));
  CHECK_THAT(text, Contains("dynapipe_job_plans_ahead{job=\"3\"} 2\n"));
  CHECK_THAT(text, !Contains("job=\"4\""));
  CHECK_THAT(text, Contains("dynapipe_redis_errors_total 2\n"));
}

}  // namespace
}  // namespace dynapipe::planner::service
