#include "planner/service/gang_placement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"

namespace dynapipe::planner::service {

std::vector<GangPlacement> PlaceGangs(const std::vector<PendingJob>& jobs, std::vector<IdleExecutor> idle, int live) {
  // Idle executors by node, each node's in device order.
  std::map<std::string, std::vector<IdleExecutor>> by_node;
  for (IdleExecutor& e : idle) by_node[e.node].push_back(std::move(e));
  for (auto& [node, list] : by_node) {
    std::sort(list.begin(), list.end(), [](const IdleExecutor& a, const IdleExecutor& b) {
      return a.device != b.device ? a.device < b.device : a.id < b.id;
    });
  }
  int free = static_cast<int>(idle.size());
  std::vector<GangPlacement> out;
  for (const PendingJob& job : jobs) {
    GangPlacement p;
    p.job = job.id;
    const int world = std::max(1, job.world);
    if (world > free) {
      p.waiting = world > live ? absl::StrFormat("waiting for executors: needs %d, %d registered and live", world, live)
                               : absl::StrFormat("waiting for executors: needs %d, %d of %d live are idle", world, free,
                                                 live);
      out.push_back(std::move(p));
      continue;
    }
    // Best fit on one node, else the fullest nodes first.
    std::vector<std::string> order;
    const std::string* best = nullptr;
    size_t best_size = 0;
    for (const auto& [node, list] : by_node) {
      if (list.size() >= static_cast<size_t>(world) && (best == nullptr || list.size() < best_size)) {
        best = &node;
        best_size = list.size();
      }
    }
    if (best != nullptr) {
      order.push_back(*best);
    } else {
      for (const auto& [node, list] : by_node) {
        if (!list.empty()) order.push_back(node);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](const std::string& a, const std::string& b) { return by_node[a].size() > by_node[b].size(); });
    }
    for (const std::string& node : order) {
      std::vector<IdleExecutor>& list = by_node[node];
      const size_t take = std::min(list.size(), static_cast<size_t>(world) - p.executors.size());
      for (size_t i = 0; i < take; ++i) p.executors.push_back(list[i].id);
      list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(take));
      if (p.executors.size() == static_cast<size_t>(world)) break;
    }
    free -= world;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace dynapipe::planner::service
