#include "planner/plan/replay.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/plan/transfers.h"

namespace dynapipe::planner {

absl::StatusOr<Replay> ReplayInOrder(std::span<const proto::ExecutionPlan> plans) {
  const int world = static_cast<int>(plans.size());
  Replay out;
  std::vector<size_t> pc(world, 0);
  std::vector<double> now(world, 0);
  // Arrival times of posted sends, per key in posting order; how many of
  // each key every rank has consumed (send finishes and receive finishes
  // count separately).
  std::map<TransferKey, std::vector<double>> arrivals;
  std::map<std::pair<TransferKey, TransferStep>, size_t> used;
  std::map<int, std::vector<int>> at_all_reduce;  // pp rank -> ranks waiting there
  for (const proto::ExecutionPlan& p : plans) {
    for (const proto::Instruction& ins : p.instructions()) out.simulated_ms = std::max(out.simulated_ms, ins.sim_end_ms());
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < world; ++r) {
      const proto::ExecutionPlan& plan = plans[r];
      while (pc[r] < static_cast<size_t>(plan.instructions_size())) {
        const proto::Instruction& ins = plan.instructions(static_cast<int>(pc[r]));
        const double duration = std::max(0.0, ins.sim_end_ms() - ins.sim_start_ms());
        const std::optional<TransferOp> x = TransferOf(ins, r);
        if (ins.has_forward() || ins.has_backward()) {
          now[r] += duration;
        } else if (x && x->step == TransferStep::kSendStart) {
          arrivals[x->key].push_back(now[r] + duration);  // the transfer's own simulated time
        } else if (x && x->step != TransferStep::kRecvStart) {  // a finish: wait for the arrival
          size_t& n = used[{x->key, x->step}];
          auto a = arrivals.find(x->key);
          if (a == arrivals.end() || a->second.size() <= n) break;  // not posted yet
          now[r] = std::max(now[r], a->second[n++]);
        } else if (ins.has_all_reduce_grads()) {
          std::vector<int>& waiting = at_all_reduce[plan.pp_rank()];
          if (std::find(waiting.begin(), waiting.end(), r) == waiting.end()) waiting.push_back(r);
          if (static_cast<int>(waiting.size()) < ins.all_reduce_grads().dp_peers_size()) break;
          double t = 0;
          for (int w : waiting) t = std::max(t, now[w]);
          for (int w : waiting) {
            now[w] = t;
            if (w != r) ++pc[w];  // the others pass their all-reduce too
          }
          waiting.clear();
        }
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    if (pc[r] < static_cast<size_t>(plans[r].instructions_size())) {
      return absl::InvalidArgumentError(absl::StrCat("replay: rank ", r, " waits forever at instruction ", pc[r]));
    }
    out.makespan_ms = std::max(out.makespan_ms, now[r]);
  }
  return out;
}

}  // namespace dynapipe::planner
