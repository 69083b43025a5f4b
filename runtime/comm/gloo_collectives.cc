// The collective thread of a Gloo communicator's core (see gloo_core.h):
// collectives checked and queued by StartCollective, run one at a time by
// CollectiveLoop as a direct exchange over the group's mesh, and waited on
// through CollectiveRequest.

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/context.h"
#include "runtime/comm/gloo_core.h"
#include "src/common/logging.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm::gloo_internal {

// A run of the collective thread: the group's mesh connected on first use,
// calls numbered per group (so every member uses the same slots).
template <typename T>
absl::StatusOr<std::unique_ptr<Request>> Core::StartCollective(Op op, absl::Span<const int> group_ranks, T* data,
                                                               size_t n, absl::Span<const size_t> counts,
                                                               absl::Time deadline) {
  std::vector<int> ranks(group_ranks.begin(), group_ranks.end());
  std::sort(ranks.begin(), ranks.end());
  RETURN_IF_ERROR(CheckGroup(ranks));
  const int m = static_cast<int>(ranks.size());
  std::vector<size_t> starts(m + 1, 0);
  if (counts.empty()) {
    for (int i = 0; i <= m; ++i) starts[i] = ShardBegin(n, m, i);
  } else {
    if (static_cast<int>(counts.size()) != m) {
      return absl::InvalidArgumentError(absl::StrCat(op == Op::kReduceScatter ? "reduce-scatter" : "all-gather",
                                                     " over ranks {", absl::StrJoin(ranks, ","), "}: counts: ",
                                                     counts.size(), " shards for ", m, " members"));
    }
    for (int i = 0; i < m; ++i) starts[i + 1] = starts[i] + counts[i];
    n = starts[m];
  }
  if (data == nullptr && n > 0) {
    return absl::InvalidArgumentError(absl::StrCat("data: null for n = ", n));
  }
  const char* name = op == Op::kAllReduce ? "all-reduce" : op == Op::kReduceScatter ? "reduce-scatter" : "all-gather";
  auto task = std::make_shared<CollectiveTask>();
  task->what = absl::StrCat(name, " of ", n, std::is_same_v<T, float> ? " floats" : " doubles", " over ranks {",
                            absl::StrJoin(ranks, ","), "}");
  if (aborted()) return AbortedError(task->what);
  if (ranks.size() > 1 && n > 0) {
    const std::shared_ptr<Group> group = FindGroup(ranks);
    task->run = [this, op, group, data, starts = std::move(starts), deadline, what = task->what]() -> absl::Status {
      if (aborted()) return AbortedError(what);
      MutexLock lock(&group->mu);
      ASSIGN_OR_RETURN(const std::shared_ptr<gloo::Context> context, Connect(*group, deadline));
      return Annotate(Direct(op, *group, context, group->calls++, data, starts, deadline), what);
    };
  } else {
    task->run = [] { return absl::OkStatus(); };
  }
  Enqueue(task);
  return std::unique_ptr<Request>(new CollectiveRequest(shared_from_this(), std::move(task)));
}

// Direct exchange over the group's full mesh. Reduce-scatter: every member
// sends each other member that member's shard and adds what it receives for
// its own in member order; all-gather: every member sends its shard to all.
// Every element is thus summed on one member, in member order, and copied to
// the others: all members end with the same bits, and an all-reduce equals a
// reduce-scatter followed by an all-gather bit for bit.
template <typename T>
absl::Status Core::Direct(Op op, const Group& group, const std::shared_ptr<gloo::Context>& context, uint64_t call,
                          T* data, const std::vector<size_t>& starts, absl::Time deadline) {
  const int m = static_cast<int>(group.ranks.size());
  const int me = group.index;
  auto begin = [&](int member) { return starts[member]; };
  auto length = [&](int member) { return starts[member + 1] - starts[member]; };
  // Slots: one per phase of each call, in a mesh no Send/Recv uses; pairs
  // tell the members' messages apart.
  auto start = [&](Direction direction, int member, int phase, T* ptr,
                   size_t count) -> absl::StatusOr<std::unique_ptr<Transfer>> {
    return Start(context, direction, member, group.ranks[member], (call << 16) | phase,
                 phase == 0 ? "reduce-scatter" : "all-gather", ptr, count * sizeof(T));
  };
  auto wait_all = [&](std::vector<std::unique_ptr<Transfer>>& transfers) -> absl::Status {
    for (auto& t : transfers) RETURN_IF_ERROR(t->Wait(deadline));
    return absl::OkStatus();
  };
  if (op != Op::kAllGather) {
    const size_t mine = length(me);
    std::vector<std::vector<T>> incoming(m);
    std::vector<std::unique_ptr<Transfer>> transfers;
    for (int k = 0; k < m; ++k) {  // receives first: a Gloo send completes once its receive is posted
      if (k == me || mine == 0) continue;
      incoming[k].resize(mine);
      ASSIGN_OR_RETURN(auto t, start(Direction::kRecv, k, 0, incoming[k].data(), mine));
      transfers.push_back(std::move(t));
    }
    for (int k = 0; k < m; ++k) {
      if (k == me || length(k) == 0) continue;
      ASSIGN_OR_RETURN(auto t, start(Direction::kSend, k, 0, data + begin(k), length(k)));
      transfers.push_back(std::move(t));
    }
    RETURN_IF_ERROR(wait_all(transfers));
    T* const own = data + begin(me);
    std::vector<T> sum(own, own + mine);
    if (me > 0) std::copy(incoming[0].begin(), incoming[0].end(), sum.begin());
    for (int k = 1; k < m; ++k) {
      const T* add = k == me ? own : incoming[k].data();
      for (size_t i = 0; i < mine; ++i) sum[i] += add[i];
    }
    std::copy(sum.begin(), sum.end(), own);
  }
  if (op != Op::kReduceScatter) {
    std::vector<std::unique_ptr<Transfer>> transfers;
    for (int k = 0; k < m; ++k) {
      if (k == me || length(k) == 0) continue;
      ASSIGN_OR_RETURN(auto t, start(Direction::kRecv, k, 1, data + begin(k), length(k)));
      transfers.push_back(std::move(t));
    }
    for (int k = 0; k < m && length(me) > 0; ++k) {
      if (k == me) continue;
      ASSIGN_OR_RETURN(auto t, start(Direction::kSend, k, 1, data + begin(me), length(me)));
      transfers.push_back(std::move(t));
    }
    RETURN_IF_ERROR(wait_all(transfers));
  }
  return absl::OkStatus();
}

void Core::Enqueue(std::shared_ptr<CollectiveTask> task) {
  MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(task));
  if (!collective_thread_.joinable() && !stop_) collective_thread_ = std::thread([this] { CollectiveLoop(); });
  if (stop_) {  // after Shutdown: nothing runs any more
    std::shared_ptr<CollectiveTask> t = std::move(queue_.back());
    queue_.pop_back();
    MutexLock done(&t->mu);
    t->result = absl::AbortedError(absl::StrCat(t->what, ": communicator destroyed"));
    t->done = true;
  }
}

void Core::CollectiveLoop() {
  for (;;) {
    std::shared_ptr<CollectiveTask> task;
    {
      MutexLock lock(&queue_mu_);
      queue_mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      collective_running_ = true;
    }
    absl::Status status = task->run();
    task->run = nullptr;  // drops what it holds (the group and its connections)
    if (!status.ok() && !absl::IsAborted(status)) Abort(status);  // peers fail fast instead of at their deadlines
    {
      MutexLock lock(&queue_mu_);
      collective_running_ = false;
    }
    MutexLock lock(&task->mu);
    task->result = std::move(status);
    task->done = true;
  }
}

CollectiveRequest::~CollectiveRequest() {
  {
    MutexLock lock(&task_->mu);
    if (task_->done) return;
  }
  // Still running (or queued) on data the caller is about to release.
  core_->Abort(absl::StrCat(task_->what, " was destroyed before it completed"));
  if (!AwaitAfterAbort()) spdlog::error("{} still runs after the communicator was aborted", task_->what);
}

bool CollectiveRequest::AwaitAfterAbort() {
  MutexLock lock(&task_->mu);
  return task_->mu.AwaitWithDeadline([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(task_->mu) { return task_->done; },
                                     absl::Now() + absl::Seconds(30));
}

absl::Status CollectiveRequest::Wait(absl::Time deadline) {
  if (result_.has_value()) return *result_;
  const absl::Time start = absl::Now();
  {
    MutexLock lock(&task_->mu);
    if (task_->mu.AwaitWithDeadline([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(task_->mu) { return task_->done; },
                                    deadline)) {
      return *(result_ = task_->result);
    }
  }
  const absl::Status late = absl::DeadlineExceededError(
      absl::StrCat(task_->what, " did not complete within ", absl::FormatDuration(absl::Now() - start)));
  core_->Abort(late);
  if (!AwaitAfterAbort()) {
    return *(result_ = absl::InternalError(absl::StrCat(task_->what, " still runs after the communicator was aborted")));
  }
  // A failure the collective found itself (a lost peer, named) says more
  // than our deadline or the abort it caused.
  MutexLock lock(&task_->mu);
  if (!task_->result.ok() && !absl::IsAborted(task_->result)) return *(result_ = task_->result);
  return *(result_ = late);
}

template absl::StatusOr<std::unique_ptr<Request>> Core::StartCollective<float>(
    Core::Op op, absl::Span<const int> group, float* data, size_t n, absl::Span<const size_t> counts,
    absl::Time deadline);
template absl::StatusOr<std::unique_ptr<Request>> Core::StartCollective<double>(
    Core::Op op, absl::Span<const int> group, double* data, size_t n, absl::Span<const size_t> counts,
    absl::Time deadline);

}  // namespace dynapipe::runtime::comm::gloo_internal
