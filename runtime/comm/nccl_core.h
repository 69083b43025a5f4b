#pragma once

// Internal to the NCCL backend (nccl_comm.cc, nccl_core.cc,
// nccl_collectives.cc): what an NcclCommunicator owns. The core (transfers,
// their launch and waits, abort and shutdown) lives in nccl_core.cc; the
// collectives over data-parallel groups (each group's communicator and
// stream) in nccl_collectives.cc. See nccl_comm.h for the contract.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/nccl_comm.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm::nccl_internal {

enum class Direction { kSend, kRecv };

// An NCCL failure as a status: UNAVAILABLE for remote and system errors
// (the network or a peer failing), INTERNAL otherwise.
absl::Status NcclError(ncclResult_t r, absl::string_view what);

// Records an event on `producer` and makes `consumer` wait for it.
absl::Status Order(cudaStream_t producer, cudaStream_t consumer);

// One transfer or collective. Owned by its Request (or the collective's
// stack frame); every field but `label`, `peer`, `dir`, `data`, `bytes` is
// read and written under the core's mutex once the op is registered.
struct Op {
  std::string label;   // "send of 4096 bytes to rank 1"
  int peer = -1;       // -1 for collectives
  std::vector<int> group;  // collectives: the members, sorted (their communicator's errors concern the op)
  Direction dir = Direction::kSend;
  void* data = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;  // recorded once the NCCL call is enqueued
  bool launched = false;       // handed to NCCL and `done` recorded
  bool finished = false;
  absl::Status result;
};

// What an NcclCommunicator and its requests share: the communicators, the
// per-peer and per-group streams, and every op in flight.
class Core {
 public:
  Core(const NcclOptions& o, KeyValueStore* store) : options_(o), store_(store) {}
  ~Core();

  const NcclOptions& options() const { return options_; }
  absl::Status InitWorld();
  absl::StatusOr<std::shared_ptr<Op>> StartP2P(Direction dir, int peer, void* data, size_t bytes);
  // A collective over the sorted `group`, enqueued on the group's stream
  // after the work queued on the compute stream; returns at once (the group's
  // communicator is made on first use, which blocks until every member
  // joined); Wait finishes it. `issue` makes the NCCL call(s).
  absl::StatusOr<std::shared_ptr<Op>> StartCollective(absl::Span<const int> group, absl::string_view kind, size_t n,
                                                      absl::Time deadline,
                                                      const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& issue);
  // Reduce-scatter (gather = false) or all-gather of consecutive shards of
  // counts[i] elements, member i's in the sorted group (comm.h's contract).
  absl::StatusOr<std::shared_ptr<Op>> StartSharded(absl::Span<const int> group, float* data,
                                                   absl::Span<const size_t> counts, bool gather, absl::Time deadline);
  // The all-reduce (sum) of data[0, n).
  template <typename T>
  absl::StatusOr<std::shared_ptr<Op>> StartAllReduce(absl::Span<const int> group, T* data, size_t n,
                                                     absl::Time deadline);
  template <typename T>
  absl::Status AllReduceSum(absl::Span<const int> group, T* data, size_t n, absl::Time deadline) {
    ASSIGN_OR_RETURN(std::shared_ptr<Op> op, StartAllReduce(group, data, n, deadline));
    const absl::Status s = Wait(op.get(), deadline);
    Drop(op.get());
    return s;
  }
  absl::Status GroupStart();
  absl::Status GroupEnd();
  // Polls `op` to completion, an error or the deadline; the errors of its
  // group's communicator (the world's for transfers) concern it. Launches
  // pending transfers first. Finishes the op on every path except a wait
  // inside an open group.
  absl::Status Wait(Op* op, absl::Time deadline);
  // Releases a request's op: an op never launched is just forgotten; one
  // whose transfer may still run aborts the communicators.
  void Drop(Op* op);
  void Abort(absl::Status cause);
  void Shutdown();

 private:
  struct Group {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  // Issues every pending transfer as one NCCL group, so transfers that
  // depend on each other (both directions of an exchange) progress together.
  absl::Status Launch();
  absl::StatusOr<ncclComm_t> InitComm(absl::string_view key, const std::vector<int>& ranks, int index,
                                      absl::Time deadline);
  // StartCollective's phases: the group's communicator and stream, made on
  // its first collective (aborts every communicator when that fails); then
  // the collective enqueued on them after the compute stream's work.
  absl::Status CreateGroup(const std::vector<int>& ranks, int index, absl::Time deadline, const std::string& what);
  absl::Status IssueCollective(const std::shared_ptr<Op>& op, const std::vector<int>& ranks, absl::Time deadline,
                               const std::string& what,
                               const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& issue);
  // Polls `*comm` (re-read under the lock each time: an abort nulls it) until
  // its pending operation settles.
  absl::Status Settle(ncclComm_t* comm, absl::Time deadline, absl::string_view what);
  absl::StatusOr<cudaStream_t> StreamFor(int peer, Direction dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool aborted() {
    MutexLock l(&mu_);
    return aborted_;
  }
  absl::Status AbortedLocked(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status s = absl::AbortedError(absl::StrCat(what, ": communicator aborted: ", cause_.message()));
    if (auto peer = LostPeer(cause_)) s = WithLostPeer(std::move(s), *peer);
    return s;
  }
  // Marks the core aborted and takes its communicators out of use; the
  // caller must call CompleteAbort() after releasing the lock, which runs
  // ncclCommAbort (it blocks while NCCL stops its kernels and threads, and
  // must not hold up other threads' waits).
  void AbortLocked(absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteAbort();
  void Finish(Op* op, absl::Status result);
  void FinishLocked(Op* op, absl::Status result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NcclOptions options_;
  KeyValueStore* const store_;
  Mutex mu_;
  ncclComm_t world_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::vector<int>, Group> groups_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, Direction>, cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool abort_done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ncclComm_t> to_abort_ ABSL_GUARDED_BY(mu_);
  absl::Status cause_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Op>> pending_ ABSL_GUARDED_BY(mu_);  // started, not launched, in order
  std::set<Op*> unfinished_ ABSL_GUARDED_BY(mu_);                  // started, not finished
  bool in_group_ ABSL_GUARDED_BY(mu_) = false;                     // between GroupStart and GroupEnd
};

template <typename T>
absl::StatusOr<std::shared_ptr<Op>> Core::StartAllReduce(absl::Span<const int> group, T* data, size_t n,
                                                         absl::Time deadline) {
  constexpr ncclDataType_t type = std::is_same_v<T, float> ? ncclFloat32 : ncclFloat64;
  return StartCollective(group, "all-reduce", n, deadline, [=](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(data, data, n, type, ncclSum, comm, stream);
  });
}

}  // namespace dynapipe::runtime::comm::nccl_internal
