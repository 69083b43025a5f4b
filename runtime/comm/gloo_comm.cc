#include "runtime/comm/gloo_comm.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/context.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "runtime/comm/gloo_support.h"
#include "src/common/logging.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm {
namespace {

using gloo_support::CatchGloo;
using gloo_support::ConnectMesh;
using gloo_support::OneLine;
using gloo_support::TimeoutUntil;
using Millis = std::chrono::milliseconds;

class Core;
struct CollectiveTask;
enum class Direction { kSend, kRecv };

// One transfer on one of the communicator's meshes; Send/Recv return it.
class Transfer final : public Request {
 public:
  Transfer(std::shared_ptr<Core> core, Direction direction, int peer, size_t bytes,
           std::string label)
      : core_(std::move(core)),
        direction_(direction),
        peer_(peer),
        bytes_(bytes),
        label_(std::move(label)) {}
  ~Transfer() override;
  absl::Status Wait(absl::Time deadline) override;

  // "recv of 64 bytes from rank 1 (tag 5)"
  std::string Describe() const {
    return absl::StrCat(direction_ == Direction::kSend ? "send of " : "recv of ", bytes_,
                        direction_ == Direction::kSend ? " bytes to rank " : " bytes from rank ",
                        peer_, " (", label_, ")");
  }

 private:
  friend class Core;

  const std::shared_ptr<Core> core_;
  const Direction direction_;
  const int peer_;  // global rank
  const size_t bytes_;
  const std::string label_;
  // Set by Core::Start; while the transfer is registered with the core (from
  // start to completion) Abort may call into it under the core's mutex, so it
  // is only reset under that mutex. Otherwise owned by the waiting thread.
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  std::optional<absl::Status> result_;  // owned by the waiting thread
};

// One collective queued for the collective thread.
struct CollectiveTask {
  std::string what;  // "all-reduce of 10 floats over ranks {0,2}"
  std::function<absl::Status()> run;
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status result ABSL_GUARDED_BY(mu);
};

// A started collective; Start* return it.
class CollectiveRequest final : public Request {
 public:
  CollectiveRequest(std::shared_ptr<Core> core, std::shared_ptr<CollectiveTask> task)
      : core_(std::move(core)), task_(std::move(task)) {}
  ~CollectiveRequest() override;
  absl::Status Wait(absl::Time deadline) override;

 private:
  // Waits for the task to finish after an abort made its transfers fail;
  // false if it still runs after a grace period (a bug: it would still touch the data).
  bool AwaitAfterAbort();

  const std::shared_ptr<Core> core_;
  const std::shared_ptr<CollectiveTask> task_;
  std::optional<absl::Status> result_;  // owned by the waiting thread
};

// Everything a communicator owns, shared with its transfers so that they may
// outlive it.
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(const GlooOptions& options, KeyValueStore* store,
       std::shared_ptr<gloo::transport::Device> device, std::shared_ptr<gloo::Context> world)
      : rank_(options.rank),
        size_(options.size),
        job_prefix_(options.job_prefix),
        connect_timeout_(options.connect_timeout),
        store_(store),
        device_(std::move(device)),
        world_(world) {
    contexts_.push_back(std::move(world));
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  absl::StatusOr<std::unique_ptr<Request>> StartP2P(Direction direction, int peer, uint64_t tag,
                                                    void* data, size_t bytes);
  // Collectives: checked here, then run one at a time on the collective
  // thread, in start order.
  enum class Op { kAllReduce, kReduceScatter, kAllGather };
  // `counts`: each member's shard (empty: even shards of n).
  template <typename T>
  absl::StatusOr<std::unique_ptr<Request>> StartCollective(Op op, absl::Span<const int> group, T* data, size_t n,
                                                           absl::Span<const size_t> counts, absl::Time deadline);
  template <typename T>
  absl::Status AllReduceSum(absl::Span<const int> group, T* data, size_t n, absl::Time deadline) {
    ASSIGN_OR_RETURN(std::unique_ptr<Request> request, StartCollective(Op::kAllReduce, group, data, n, {}, deadline));
    // A moment past the transfers' own deadline, so that a lost peer is
    // reported by the transfer that waited on it, naming that peer.
    return request->Wait(deadline + absl::Seconds(1));
  }

  // Closes every connection (resetting them, so peers notice at once), then
  // interrupts the registered transfers. Idempotent; returns once closed.
  void Abort(absl::string_view reason) { Abort(absl::AbortedError(reason)); }
  // As above; a cause that lost a peer (LostPeer) passes that peer on to
  // every transfer the abort fails.
  void Abort(const absl::Status& cause);
  // For the communicator's destructor: aborts if transfers are in flight, then
  // drops the meshes, which closes their sockets gracefully (queued bytes are
  // still delivered) unless Abort reset them.
  void Shutdown();

  bool aborting() {
    MutexLock lock(&mu_);
    return aborting_;
  }
  bool aborted() {
    MutexLock lock(&mu_);
    return aborted_;
  }
  // ABORTED: "<what>: communicator aborted: <reason>".
  absl::Status AbortedError(absl::string_view what) {
    MutexLock lock(&mu_);
    return AbortedErrorLocked(what);
  }
  absl::Status AbortedErrorLocked(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status error = absl::AbortedError(absl::StrCat(what, ": communicator aborted: ", abort_reason_));
    return abort_lost_peer_.has_value() ? WithLostPeer(std::move(error), *abort_lost_peer_) : error;
  }

 private:
  friend class Transfer;

  // Members of one all-reduce group and the mesh connecting them.
  struct Group {
    std::vector<int> ranks;  // sorted global ranks
    int index = 0;           // this rank's position in `ranks`
    Mutex mu;                // serializes this group's collectives
    std::shared_ptr<gloo::Context> context ABSL_GUARDED_BY(mu);  // null until connected
    uint64_t calls ABSL_GUARDED_BY(mu) = 0;  // numbers all-reduces, giving each its own slots
  };

  absl::StatusOr<std::unique_ptr<Transfer>> Start(const std::shared_ptr<gloo::Context>& context,
                                                  Direction direction, int context_peer, int peer,
                                                  uint64_t slot, std::string label, void* data,
                                                  size_t bytes);
  absl::Status CheckGroup(const std::vector<int>& ranks) const;
  std::shared_ptr<Group> FindGroup(const std::vector<int>& ranks);
  absl::StatusOr<std::shared_ptr<gloo::Context>> Connect(Group& group, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(group.mu);
  // `starts`: where each member's shard begins, then the end (members + 1 entries).
  template <typename T>
  absl::Status Direct(Op op, const Group& group, const std::shared_ptr<gloo::Context>& context, uint64_t call,
                      T* data, const std::vector<size_t>& starts, absl::Time deadline);
  // Runs queued collectives until Shutdown.
  void CollectiveLoop();
  void Enqueue(std::shared_ptr<CollectiveTask> task);

  const int rank_;
  const int size_;
  const std::string job_prefix_;
  const absl::Duration connect_timeout_;
  KeyValueStore* const store_;
  const std::shared_ptr<gloo::transport::Device> device_;
  // The Send/Recv mesh; reset only by Shutdown (no calls may race with it).
  std::shared_ptr<gloo::Context> world_;

  Mutex mu_;
  bool aborting_ ABSL_GUARDED_BY(mu_) = false;  // Abort has begun
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;   // ... and closed every connection
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  std::optional<int> abort_lost_peer_ ABSL_GUARDED_BY(mu_);  // the cause lost this peer
  std::vector<std::shared_ptr<gloo::Context>> contexts_ ABSL_GUARDED_BY(mu_);  // world + groups
  std::map<std::vector<int>, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  // Started transfers that have not completed.
  absl::flat_hash_set<Transfer*> live_ ABSL_GUARDED_BY(mu_);

  // The collective thread (started with the first collective) and its queue.
  Mutex queue_mu_;
  std::deque<std::shared_ptr<CollectiveTask>> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  bool collective_running_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread collective_thread_;  // started and joined under queue_mu_ ordering (Enqueue, Shutdown)
};

Transfer::~Transfer() {
  bool pending;
  {
    MutexLock lock(&core_->mu_);
    pending = core_->live_.contains(this);
  }
  if (!pending) return;
  // Gloo holds only a weak pointer to the buffer: bytes arriving for it after
  // this would stall the connection for good. Fail everything fast instead.
  core_->Abort(absl::StrCat(Describe(), " was destroyed before it completed"));
  MutexLock lock(&core_->mu_);
  core_->live_.erase(this);
  buffer_.reset();
}

absl::Status Transfer::Wait(absl::Time deadline) {
  if (result_.has_value()) return *result_;
  if (core_->aborted()) return *(result_ = core_->AbortedError(Describe()));
  const absl::Time start = absl::Now();
  bool completed = false;
  std::string error;
  try {
    const Millis timeout = TimeoutUntil(deadline);
    completed =
        direction_ == Direction::kSend ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
  } catch (const std::exception& e) {
    error = OneLine(e.what());
  } catch (...) {
    error = "unknown exception";
  }
  absl::Status status;
  if (completed) {
    MutexLock lock(&core_->mu_);
    core_->live_.erase(this);
    buffer_.reset();
  } else if (core_->aborting()) {
    // Returned false (Abort interrupted the wait) or the connection failed
    // because Abort closed it.
    status = core_->AbortedError(Describe());
  } else if (absl::StrContains(error, "Timed out waiting")) {
    // Before throwing, Gloo has closed every connection of this mesh.
    status = WithLostPeer(absl::DeadlineExceededError(absl::StrCat(Describe(), " did not complete within ",
                                                                   absl::FormatDuration(absl::Now() - start))),
                          peer_);
  } else if (!error.empty()) {
    status = WithLostPeer(
        absl::UnavailableError(absl::StrCat(Describe(), ": connection to rank ", peer_, " failed: ", error)), peer_);
  } else {
    status = absl::InternalError(absl::StrCat(Describe(), ": wait interrupted without an abort"));
  }
  if (!status.ok() && !absl::IsAborted(status)) core_->Abort(status);
  return *(result_ = status);
}

absl::StatusOr<std::unique_ptr<Transfer>> Core::Start(const std::shared_ptr<gloo::Context>& context,
                                                      Direction direction, int context_peer,
                                                      int peer, uint64_t slot, std::string label,
                                                      void* data, size_t bytes) {
  auto transfer =
      std::make_unique<Transfer>(shared_from_this(), direction, peer, bytes, std::move(label));
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  RETURN_IF_ERROR(
      CatchGloo(transfer->Describe(), [&] { buffer = context->createUnboundBuffer(data, bytes); }));
  gloo::transport::UnboundBuffer* const raw = buffer.get();
  {
    MutexLock lock(&mu_);
    if (aborting_) return AbortedErrorLocked(transfer->Describe());
    transfer->buffer_ = std::move(buffer);
    live_.insert(transfer.get());
  }
  // Outside mu_: an Abort meanwhile closes the pair first, so this throws or
  // the wait sees the abort.
  absl::Status status =
      CatchGloo(absl::StrCat(transfer->Describe(), ": connection to rank ", peer, " failed"), [&] {
        if (direction == Direction::kSend) {
          raw->send(context_peer, slot, 0, bytes);
        } else {
          raw->recv(context_peer, slot, 0, bytes);
        }
      });
  if (!status.ok()) {
    if (aborting()) return AbortedError(transfer->Describe());
    status = WithLostPeer(std::move(status), peer);
    Abort(status);
    return status;  // the transfer is destroyed after the abort closed its pair
  }
  return transfer;
}

absl::StatusOr<std::unique_ptr<Request>> Core::StartP2P(Direction direction, int peer, uint64_t tag,
                                                        void* data, size_t bytes) {
  if (peer < 0 || peer >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer: rank ", peer, " is out of range for a world of ", size_, " ranks"));
  }
  if (peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("peer: rank ", peer, " is this rank"));
  }
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("data: null for ", bytes, " bytes"));
  }
  // World ranks are the mesh's ranks; the tag is Gloo's slot.
  ASSIGN_OR_RETURN(
      std::unique_ptr<Transfer> transfer,
      Start(world_, direction, peer, peer, tag, absl::StrCat("tag ", tag), data, bytes));
  return std::unique_ptr<Request>(std::move(transfer));
}

void Core::Abort(const absl::Status& cause) {
  const absl::string_view reason = cause.message();
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  {
    MutexLock lock(&mu_);
    if (aborting_) {
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_; });
      return;
    }
    aborting_ = true;
    abort_reason_ = std::string(reason);
    abort_lost_peer_ = LostPeer(cause);
    contexts = contexts_;
  }
  spdlog::warn("rank {}: aborting communicator: {}", rank_, reason);
  // Gloo's close() resets the connection (SO_LINGER 0) and returns once its
  // I/O thread no longer touches the pair, so no buffer is written after this.
  // It does not wake local waiters; AbortWait below does.
  for (const auto& context : contexts) {
    const absl::Status status =
        CatchGloo("closing connections", [&] { context->closeConnections(); });
    if (!status.ok()) spdlog::warn("rank {}: {}", rank_, status.message());
  }
  MutexLock lock(&mu_);
  aborted_ = true;
  // Gloo's abort flags are sticky: a wait that starts after this returns at once.
  for (Transfer* transfer : live_) {
    if (transfer->direction_ == Direction::kSend) {
      transfer->buffer_->abortWaitSend();
    } else {
      transfer->buffer_->abortWaitRecv();
    }
  }
}

void Core::Shutdown() {
  // Stop the collective thread from taking new work first: a collective it
  // still runs could otherwise start a transfer after the check below.
  bool collectives_busy;
  {
    MutexLock lock(&queue_mu_);
    stop_ = true;
    collectives_busy = collective_running_ || !queue_.empty();
  }
  size_t in_flight;
  {
    MutexLock lock(&mu_);
    in_flight = live_.size();
  }
  if (in_flight > 0 || collectives_busy) {
    Abort(absl::StrCat("communicator destroyed with ", in_flight, " transfers in flight",
                       collectives_busy ? " and collectives unfinished" : ""));
  }
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  std::map<std::vector<int>, std::shared_ptr<Group>> groups;
  {
    MutexLock lock(&mu_);
    if (!aborting_) abort_reason_ = "communicator destroyed";
    aborting_ = aborted_ = true;
    contexts.swap(contexts_);
    groups.swap(groups_);
  }
  world_.reset();
  // Queued collectives fail at once (aborted); the thread ends with the queue.
  std::thread thread;
  {
    MutexLock lock(&queue_mu_);
    thread = std::move(collective_thread_);
  }
  if (thread.joinable()) thread.join();
  // Destroying the last references closes the sockets (after unlocking mu_:
  // closing waits for Gloo's I/O thread).
}

absl::Status Core::CheckGroup(const std::vector<int>& ranks) const {
  if (ranks.empty()) return absl::InvalidArgumentError("group: empty");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group: rank ", ranks[i], " is out of range for a world of ", size_, " ranks"));
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("group: rank ", ranks[i], " is listed twice"));
    }
  }
  if (!std::binary_search(ranks.begin(), ranks.end(), rank_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("group: this rank (", rank_, ") is not in {", absl::StrJoin(ranks, ","), "}"));
  }
  return absl::OkStatus();
}

std::shared_ptr<Core::Group> Core::FindGroup(const std::vector<int>& ranks) {
  MutexLock lock(&mu_);
  std::shared_ptr<Group>& group = groups_[ranks];
  if (group == nullptr) {
    group = std::make_shared<Group>();
    group->ranks = ranks;
    group->index = std::lower_bound(ranks.begin(), ranks.end(), rank_) - ranks.begin();
  }
  return group;
}

absl::StatusOr<std::shared_ptr<gloo::Context>> Core::Connect(Group& group, absl::Time deadline) {
  if (group.context != nullptr) return group.context;
  const std::string members = absl::StrCat("{", absl::StrJoin(group.ranks, ","), "}");
  const absl::Time connect_deadline = std::min(deadline, absl::Now() + connect_timeout_);
  auto context = std::make_shared<gloo::rendezvous::Context>(group.index, group.ranks.size());
  absl::Status status =
      ConnectMesh(*context, device_, store_,
                  absl::StrCat(job_prefix_, "/group/", absl::StrJoin(group.ranks, ","), "/"),
                  connect_deadline, [this] { return aborting(); });
  if (!status.ok()) {
    if (aborting()) return AbortedError(absl::StrCat("connecting group ", members));
    status = Annotate(status, absl::StrCat("connecting group ", members));
    Abort(status.message());
    return status;
  }
  {
    MutexLock lock(&mu_);
    if (!aborting_) {
      contexts_.push_back(context);
      group.context = context;
      spdlog::debug("rank {}: connected all-reduce group {}", rank_, members);
      return group.context;
    }
  }
  // Abort ran while we connected and could not see this mesh.
  CatchGloo("closing connections", [&] { context->closeConnections(); }).IgnoreError();
  return AbortedError(absl::StrCat("connecting group ", members));
}

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

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~GlooCommunicator() override { core_->Shutdown(); }

  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  absl::StatusOr<std::unique_ptr<Request>> Send(int peer, uint64_t tag, const void* data,
                                                size_t bytes) override {
    // Gloo's buffers are not const-qualified; a send only reads.
    return core_->StartP2P(Direction::kSend, peer, tag, const_cast<void*>(data), bytes);
  }
  absl::StatusOr<std::unique_ptr<Request>> Recv(int peer, uint64_t tag, void* data,
                                                size_t bytes) override {
    return core_->StartP2P(Direction::kRecv, peer, tag, data, bytes);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, float* data, size_t n,
                            absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, double* data, size_t n,
                            absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllReduceSum(absl::Span<const int> group, float* data, size_t n,
                                                             absl::Time deadline) override {
    return core_->StartCollective(Core::Op::kAllReduce, group, data, n, {}, deadline);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                 absl::Span<const size_t> counts,
                                                                 absl::Time deadline) override {
    return core_->StartCollective(Core::Op::kReduceScatter, group, data, 0, counts, deadline);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllGather(absl::Span<const int> group, float* data,
                                                          absl::Span<const size_t> counts,
                                                          absl::Time deadline) override {
    return core_->StartCollective(Core::Op::kAllGather, group, data, 0, counts, deadline);
  }
  bool overlaps_collectives() const override { return true; }
  void Abort() override { core_->Abort("Abort() called"); }

 private:
  const std::shared_ptr<Core> core_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     KeyValueStore* store) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.size: ", options.size, " is not positive"));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.rank: ", options.rank, " is not in [0, ", options.size, ")"));
  }
  if (options.job_prefix.empty()) return absl::InvalidArgumentError("options.job_prefix: empty");
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.connect_timeout: not positive");
  }
  if (store == nullptr) return absl::InvalidArgumentError("store: null");

  const absl::Time start = absl::Now();
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status status = CatchGloo("creating the TCP device", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.interface_address;
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.interface_address: cannot listen on '",
                                                   options.interface_address,
                                                   "': ", status.message()));
  }
  auto world = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  const absl::Time deadline = start + options.connect_timeout;
  status =
      ConnectMesh(*world, device, store, absl::StrCat(options.job_prefix, "/world/"), deadline);
  if (!status.ok()) {
    return Annotate(status, absl::StrCat("rank ", options.rank, " of ", options.size,
                                         " joining job '", options.job_prefix, "'"));
  }
  spdlog::info("rank {} of {}: gloo communicator for job '{}' connected on {} in {}", options.rank,
               options.size, options.job_prefix, device->str(),
               absl::FormatDuration(absl::Now() - start));
  return std::unique_ptr<Communicator>(new GlooCommunicator(
      std::make_shared<Core>(options, store, std::move(device), std::move(world))));
}

}  // namespace dynapipe::runtime::comm
