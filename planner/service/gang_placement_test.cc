#include "planner/service/gang_placement.h"

#include <catch2/catch.hpp>

namespace dynapipe::planner::service {
namespace {

std::vector<IdleExecutor> Cluster(const std::vector<std::pair<std::string, int>>& nodes) {
  std::vector<IdleExecutor> out;
  for (const auto& [node, devices] : nodes) {
    for (int d = devices - 1; d >= 0; --d) out.push_back({node + "-gpu" + std::to_string(d), node, d});
  }
  return out;
}

TEST_CASE("A job larger than the idle executors takes none; a later job that fits starts") {
  const auto placed = PlaceGangs({{"1", 8}, {"2", 2}}, Cluster({{"a", 2}, {"b", 2}}), 4);
  REQUIRE(placed.size() == 2);
  CHECK(placed[0].job == "1");
  CHECK(placed[0].executors.empty());
  CHECK(placed[0].waiting == "waiting for executors: needs 8, 4 registered and live");
  CHECK(placed[1].executors.size() == 2);
  CHECK(placed[1].waiting.empty());
}

TEST_CASE("A job waiting for busy executors says how many are idle") {
  const auto placed = PlaceGangs({{"1", 3}, {"2", 2}}, Cluster({{"a", 2}}), 6);
  CHECK(placed[0].waiting == "waiting for executors: needs 3, 2 of 6 live are idle");
  CHECK(placed[1].executors == std::vector<std::string>{"a-gpu0", "a-gpu1"});
}

TEST_CASE("Each executor goes to one job; ranks are in device order on the best-fitting node") {
  const auto placed = PlaceGangs({{"1", 2}, {"2", 4}, {"3", 3}}, Cluster({{"a", 4}, {"b", 2}, {"c", 3}}), 9);
  // Job 1 (2 ranks) fits node b exactly; job 2 (4) takes a; job 3 (3) takes c.
  CHECK(placed[0].executors == std::vector<std::string>{"b-gpu0", "b-gpu1"});
  CHECK(placed[1].executors == std::vector<std::string>{"a-gpu0", "a-gpu1", "a-gpu2", "a-gpu3"});
  CHECK(placed[2].executors == std::vector<std::string>{"c-gpu0", "c-gpu1", "c-gpu2"});
}

TEST_CASE("A job spanning nodes takes the fullest nodes first, neighbouring ranks on one node") {
  const auto placed = PlaceGangs({{"1", 5}}, Cluster({{"a", 1}, {"b", 3}, {"c", 2}}), 6);
  CHECK(placed[0].executors == std::vector<std::string>{"b-gpu0", "b-gpu1", "b-gpu2", "c-gpu0", "c-gpu1"});
}

TEST_CASE("Nothing idle, nothing registered: every job waits, none placed") {
  const auto placed = PlaceGangs({{"1", 1}}, {}, 0);
  CHECK(placed[0].executors.empty());
  CHECK(placed[0].waiting == "waiting for executors: needs 1, 0 registered and live");
}

}  // namespace
}  // namespace dynapipe::planner::service
