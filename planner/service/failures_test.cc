#include "planner/service/failures.h"

#include <catch2/catch.hpp>
#include <optional>

namespace dynapipe::planner::service {
namespace {

proto::IterationReport Failure(int rank, std::optional<int> lost_peer, const std::string& error) {
  proto::IterationReport r;
  r.set_rank(rank);
  r.set_error(error);
  if (lost_peer.has_value()) r.set_lost_peer(*lost_peer);
  return r;
}

TEST_CASE("a rank's own failure decides at once") {
  const auto v = JudgeFailures({Failure(2, std::nullopt, "rank 2: dataset: no such file")}, 4, false);
  CHECK(v.decided);
  CHECK(v.error == "rank 2: dataset: no such file");
  // ... even after bystanders' reports.
  const auto w = JudgeFailures({Failure(0, 2, "lost 2"), Failure(2, std::nullopt, "own")}, 4, false);
  CHECK(w.decided);
  CHECK(w.error == "own");
}

TEST_CASE("a dead rank is named even when a bystander reports first") {
  // pp2 x dp2: rank 1 is killed; rank 3 loses it and aborts, so rank 2 loses
  // rank 3 and reports first.
  std::vector<proto::IterationReport> f = {Failure(2, 3, "rank 2: recv from rank 3 failed")};
  CHECK_FALSE(JudgeFailures(f, 4, false).decided);
  f.push_back(Failure(3, 1, "rank 3: recv from rank 1 failed"));
  CHECK_FALSE(JudgeFailures(f, 4, false).decided);  // rank 0 may still report
  f.push_back(Failure(0, 1, "rank 0: recv from rank 1 failed"));
  const auto v = JudgeFailures(f, 4, false);  // every rank reported or is lost
  CHECK(v.decided);
  CHECK(v.error == "rank 1 failed (ranks 0, 3 lost it): rank 3: recv from rank 1 failed");
}

TEST_CASE("at the deadline the silent lost ranks are named; without any, the first report") {
  const std::vector<proto::IterationReport> one = {Failure(2, 3, "rank 2: recv from rank 3 failed")};
  const auto v = JudgeFailures(one, 4, true);
  CHECK(v.decided);
  CHECK(v.error == "rank 3 failed (rank 2 lost it): rank 2: recv from rank 3 failed");
  // Everyone reported, each losing another (a network fault): the first report.
  const auto w = JudgeFailures({Failure(0, 1, "a"), Failure(1, 0, "b")}, 2, false);
  CHECK(w.decided);
  CHECK(w.error == "a");
  CHECK_FALSE(JudgeFailures({}, 2, true).decided);
}

TEST_CASE("two silent ranks wait for the deadline, then are both named") {
  // Rank 2 may be a bystander whose report is on its way.
  CHECK_FALSE(JudgeFailures({Failure(0, 1, "x"), Failure(3, 2, "y")}, 4, false).decided);
  const auto v = JudgeFailures({Failure(0, 1, "x"), Failure(3, 2, "y")}, 4, true);
  CHECK(v.decided);
  CHECK(v.error == "ranks 1, 2 failed (ranks 0, 3 lost them): x");
}

}  // namespace
}  // namespace dynapipe::planner::service
