#include "planner/service/failures.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dynapipe::planner::service {
namespace {

std::string Ranks(const std::set<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

FailureVerdict JudgeFailures(const std::vector<proto::IterationReport>& failures, int world, bool final) {
  if (failures.empty()) return {};
  std::set<int> reporters, lost;
  for (const proto::IterationReport& f : failures) {
    if (!f.has_lost_peer()) return {true, f.error()};  // this rank's own failure
    reporters.insert(f.rank());
    if (f.lost_peer() >= 0 && f.lost_peer() < world) lost.insert(f.lost_peer());
  }
  std::set<int> silent;  // lost by others, never reported
  for (int r : lost) {
    if (!reporters.contains(r)) silent.insert(r);
  }
  if (!final && static_cast<int>(reporters.size()) < world - 1) return {};
  if (silent.empty()) return {true, failures.front().error()};
  std::set<int> witnesses;
  const proto::IterationReport* first = nullptr;
  for (const proto::IterationReport& f : failures) {
    if (!silent.contains(f.lost_peer())) continue;
    witnesses.insert(f.rank());
    if (first == nullptr) first = &f;
  }
  return {true, absl::StrCat(Ranks(silent), " failed (", Ranks(witnesses), " lost ",
                             silent.size() == 1 ? "it" : "them", "): ", first->error())};
}

}  // namespace dynapipe::planner::service
