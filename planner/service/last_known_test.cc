#include "planner/service/last_known.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"

namespace dynapipe::planner::service {
namespace {

proto::JobStatus Job(const std::string& id, proto::JobState::Value state, int64_t done) {
  proto::JobStatus s;
  s.set_job_id(id);
  s.set_state(state);
  s.set_iterations_done(done);
  return s;
}

const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);

TEST_CASE("The last known state keeps the newest read of each job; an older read finishing late changes nothing") {
  LastKnown k;
  CHECK(k.AllJobs().at == absl::InfinitePast());
  k.PutJob(Job("a", proto::JobState::running, 5), t0 + absl::Seconds(2));
  k.PutJob(Job("a", proto::JobState::running, 3), t0 + absl::Seconds(1));  // older
  REQUIRE(k.GetJob("a"));
  CHECK(k.GetJob("a")->status.iterations_done() == 5);
  CHECK(k.GetJob("a")->at == t0 + absl::Seconds(2));
  CHECK(k.AllJobs().at == absl::InfinitePast());  // no whole list read yet
  k.PutJobs({Job("b", proto::JobState::pending, 0)}, t0 + absl::Seconds(3));
  const LastKnown::Jobs all = k.AllJobs();
  CHECK(all.at == t0 + absl::Seconds(3));
  REQUIRE(all.jobs.size() == 2);  // a is kept: the store drops jobs only with all its data
  CHECK(all.jobs[0].job_id() == "a");
  CHECK(all.jobs[1].job_id() == "b");
  CHECK_FALSE(k.GetJob("c"));
}

TEST_CASE("A store that lost its data turns the known jobs into lost ones; reads from before the loss are ignored") {
  LastKnown k;
  k.PutJobs({Job("a", proto::JobState::running, 7), Job("b", proto::JobState::succeeded, 10)}, t0);
  proto::ExecutorRecord e;
  e.set_executor_id("x");
  k.PutExecutors({e}, t0);
  k.StoreLost(t0 + absl::Seconds(5), "old1", "new2");
  CHECK_FALSE(k.GetJob("a"));
  CHECK(k.AllJobs().jobs.empty());
  CHECK(k.AllExecutors().executors.empty());
  REQUIRE(k.GetLost("a"));
  CHECK(k.GetLost("a")->last.iterations_done() == 7);
  CHECK(k.GetLost("a")->old_store == "old1");
  CHECK(k.GetLost("a")->new_store == "new2");
  CHECK(k.GetLost("a")->at == t0 + absl::Seconds(5));
  CHECK(k.Losses().unfinished == 1);  // b had ended
  CHECK(k.Losses().at == t0 + absl::Seconds(5));
  // A read that started before the loss was found finishes after it.
  k.PutJob(Job("a", proto::JobState::running, 8), t0 + absl::Seconds(4));
  k.PutExecutors({e}, t0 + absl::Seconds(4));
  CHECK_FALSE(k.GetJob("a"));
  CHECK(k.AllExecutors().executors.empty());
  // The new store's jobs are known as usual.
  k.PutJob(Job("c", proto::JobState::pending, 0), t0 + absl::Seconds(6));
  CHECK(k.GetJob("c"));
  CHECK_FALSE(k.GetLost("c"));
}

TEST_CASE("Lost jobs are remembered up to kMaxLost, the newest kept") {
  LastKnown k;
  for (size_t i = 0; i < LastKnown::kMaxLost + 5; ++i) {
    k.PutJob(Job(absl::StrFormat("j%05d", i), proto::JobState::running, 0), t0 + absl::Seconds(i));
    if (i % 1000 == 999 || i + 1 == LastKnown::kMaxLost + 5) {
      k.StoreLost(t0 + absl::Seconds(i) + absl::Milliseconds(500), "a", "b");
    }
  }
  CHECK_FALSE(k.GetLost("j00000"));
  CHECK_FALSE(k.GetLost("j00004"));
  CHECK(k.GetLost("j00005"));
  CHECK(k.GetLost(absl::StrFormat("j%05d", LastKnown::kMaxLost + 4)));
}

}  // namespace
}  // namespace dynapipe::planner::service
