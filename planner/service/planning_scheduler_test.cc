// PlanningScheduler over the in-memory store: plans stay `planner_lookahead`
// iterations ahead of training, honour other processes' leases, and a job
// that cannot be planned fails with the reason.
#include "planner/service/planning_scheduler.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <random>
#include <thread>

#include "planner/testing/test_specs.h"
#include "src/common/file_util.h"
#include "src/spec/job_spec.h"
#include "src/store/memory_plan_store.h"
#include "src/testing/status_require.h"
#include "src/testing/eventually.h"

namespace dynapipe::planner::service {
namespace {

using ::dynapipe::testing::Eventually;

using Catch::Matchers::Contains;

// A 2-stage GPT job of 6 iterations on 300 sample lengths, planned 2 ahead.
proto::JobSpec Job(const std::string& dataset) {
  proto::JobSpec s;
  s.set_name("sched");
  *s.mutable_model() = testing::Gpt(4, 256, 4);
  *s.mutable_cluster() = testing::H100Cluster();
  s.mutable_parallelism()->set_pp(2);
  s.mutable_dataset()->set_path(dataset);
  s.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
  s.mutable_batching()->set_global_batch_tokens(8192);
  s.mutable_batching()->set_max_seq_len(512);
  s.set_iterations(6);
  s.set_planner_lookahead(2);
  auto normalized = spec::NormalizeJobSpec(s);
  REQUIRE_OK(normalized.status());
  return *normalized;
}

std::string LengthsFile() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/sched-lengths-" + std::to_string(::getpid()) + ".txt";
  std::mt19937 rng(3);
  std::string text;
  for (int i = 0; i < 300; ++i) text += std::to_string(std::uniform_int_distribution<int>(16, 512)(rng)) + "\n";
  REQUIRE_OK(WriteFileAtomic(path, text));
  return path;
}

// A scheduler with one planning thread over `store`, stopped on scope exit.
struct Scheduling {
  explicit Scheduling(store::PlanStore* store)
      : runtimes(store, "/"),
        scheduler(store, &runtimes, &metrics, {"p1", absl::Seconds(10), absl::Hours(1), absl::Milliseconds(20)}),
        thread([this] { scheduler.Run(); }) {}
  ~Scheduling() {
    scheduler.Stop();
    thread.join();
  }
  JobRuntimes runtimes;
  http::Metrics metrics;
  PlanningScheduler scheduler;
  std::thread thread;
};

bool Planned(store::PlanStore& store, const std::string& job, int64_t iteration) {
  auto p = store.IsPlanned(job, iteration);
  return p.ok() && *p;
}

TEST_CASE("The scheduler plans lookahead iterations ahead of the ranks' reports", "[scheduler]") {
  store::MemoryPlanStore store;
  ASSIGN_OR_REQUIRE(const std::string job, store.CreateJob(Job(LengthsFile()), 0, 0));
  Scheduling s(&store);
  REQUIRE(Eventually([&] { return Planned(store, job, 0) && Planned(store, job, 1); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(Planned(store, job, 2));  // two ahead of iteration 0, no more
  ASSIGN_OR_REQUIRE(const proto::ExecutionPlan plan, store.GetPlan(job, 1, 1));
  CHECK(plan.iteration() == 1);
  for (int rank = 0; rank < 2; ++rank) {
    proto::IterationReport r;
    r.set_job_id(job);
    r.set_iteration(0);
    r.set_rank(rank);
    REQUIRE_OK(store.PutReport(r, absl::Hours(1)));
  }
  s.scheduler.Wake();
  REQUIRE(Eventually([&] { return Planned(store, job, 2); }));
  CHECK(s.runtimes.size() == 1);
}

TEST_CASE("An iteration leased by another planner process is left to it", "[scheduler]") {
  store::MemoryPlanStore store;
  ASSIGN_OR_REQUIRE(const std::string job, store.CreateJob(Job(LengthsFile()), 0, 0));
  ASSIGN_OR_REQUIRE(const bool leased, store.TryLease(job, 0, "p2", absl::Seconds(10)));
  REQUIRE(leased);
  Scheduling s(&store);
  REQUIRE(Eventually([&] { return Planned(store, job, 1); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(Planned(store, job, 0));
}

TEST_CASE("A job whose data cannot be read fails, naming the field", "[scheduler]") {
  store::MemoryPlanStore store;
  ASSIGN_OR_REQUIRE(const std::string job, store.CreateJob(Job("/nonexistent/lengths.txt"), 0, 0));
  Scheduling s(&store);
  REQUIRE(Eventually([&] {
    auto st = store.GetJob(job);
    return st.ok() && st->state() == proto::JobState::failed;
  }));
  ASSIGN_OR_REQUIRE(const proto::JobStatus st, store.GetJob(job));
  CHECK_THAT(st.error(), Contains("dataset.path"));
  CHECK_FALSE(Planned(store, job, 0));
}

TEST_CASE("A job that ended is not loaded again", "[scheduler]") {
  store::MemoryPlanStore store;
  ASSIGN_OR_REQUIRE(const std::string job, store.CreateJob(Job(LengthsFile()), 0, 0));
  JobRuntimes runtimes(&store, "/");
  REQUIRE_OK(store.SetJobState(job, proto::JobState::cancelled, "", 0).status());
  auto rt = runtimes.Get(job);
  REQUIRE(rt.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(rt.status().message()), Contains("has ended (cancelled)"));
  CHECK(runtimes.size() == 0);
}

// Cancels a job right after the first read of it: the scheduler then finds it
// running, leases an iteration and only meets the cancel when it loads it.
class CancelsAfterFirstRead : public store::MemoryPlanStore {
 public:
  absl::StatusOr<proto::JobStatus> GetJob(const std::string& job) override {
    auto status = MemoryPlanStore::GetJob(job);
    if (status.ok() && reads_++ == 0) (void)SetJobState(job, proto::JobState::cancelled, "", 0);
    return status;
  }

 private:
  std::atomic<int> reads_{0};
};

TEST_CASE("A job cancelled while the scheduler claims it is neither loaded nor planned", "[scheduler]") {
  CancelsAfterFirstRead store;
  ASSIGN_OR_REQUIRE(const std::string job, store.CreateJob(Job(LengthsFile()), 0, 0));
  Scheduling s(&store);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // some 15 scheduler passes
  ASSIGN_OR_REQUIRE(const proto::JobStatus st, store.GetJob(job));
  CHECK(st.state() == proto::JobState::cancelled);
  CHECK_FALSE(Planned(store, job, 0));
  CHECK(s.runtimes.size() == 0);
}

}  // namespace
}  // namespace dynapipe::planner::service
