#pragma once

// Internal to the Gloo backend (gloo_comm.cc, gloo_core.cc,
// gloo_collectives.cc): what a GlooCommunicator owns. The core (transfers,
// abort/shutdown, groups and their meshes) lives in gloo_core.cc; the
// collective thread and its requests in gloo_collectives.cc.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/gloo_comm.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm::gloo_internal {

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

// StartCollective is defined in gloo_collectives.cc for the element types
// Communicator's collectives take.
extern template absl::StatusOr<std::unique_ptr<Request>> Core::StartCollective<float>(
    Core::Op op, absl::Span<const int> group, float* data, size_t n, absl::Span<const size_t> counts,
    absl::Time deadline);
extern template absl::StatusOr<std::unique_ptr<Request>> Core::StartCollective<double>(
    Core::Op op, absl::Span<const int> group, double* data, size_t n, absl::Span<const size_t> counts,
    absl::Time deadline);

}  // namespace dynapipe::runtime::comm::gloo_internal
