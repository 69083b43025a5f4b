#include "runtime/comm/nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/device/cuda_status.h"
#include "src/common/logging.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm {
namespace {

enum class Direction { kSend, kRecv };

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(r));
  // A remote or system error is the network or a peer failing, not a bug here.
  if (r == ncclRemoteError || r == ncclSystemError) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

// Short sleeps that grow to 200 us: transfers of a few hundred microseconds
// are noticed quickly, long waits do not spin a core.
class Backoff {
 public:
  void Pause() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    delay_us_ = std::min(delay_us_ * 2, 200);
  }

 private:
  int spins_ = 0;
  int delay_us_ = 10;
};

// Records an event on `producer` and makes `consumer` wait for it.
absl::Status Order(cudaStream_t producer, cudaStream_t consumer) {
  cudaEvent_t ready;
  if (cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda::CudaStatus(e, "cudaEventCreateWithFlags");
  }
  cudaError_t e = cudaEventRecord(ready, producer);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(consumer, ready, 0);
  cudaEventDestroy(ready);  // released once the wait has been satisfied
  return e == cudaSuccess ? absl::OkStatus() : cuda::CudaStatus(e, "ordering the transfer after the compute stream");
}

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

// A failure tagged with the lost peer, except aborts: those repeat a cause
// found elsewhere (AbortedLocked carries that cause's peer, if any).
absl::Status Tag(absl::Status s, int peer) {
  if (peer < 0 || s.ok() || absl::IsAborted(s)) return s;
  return WithLostPeer(std::move(s), peer);
}

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

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with deadlines
  return config;
}

absl::Status Core::Settle(ncclComm_t* comm, absl::Time deadline, absl::string_view what) {
  Backoff backoff;
  for (;;) {
    {
      MutexLock l(&mu_);
      if (aborted_) return AbortedLocked(what);
      if (*comm == nullptr) return absl::FailedPreconditionError(absl::StrCat(what, ": no communicator"));
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(*comm, &state); r != ncclSuccess) return NcclError(r, what);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return NcclError(state, what);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL did not finish within the deadline"));
    }
    backoff.Pause();
  }
}

absl::StatusOr<ncclComm_t> Core::InitComm(absl::string_view key, const std::vector<int>& ranks, int index,
                                          absl::Time deadline) {
  ncclUniqueId id;
  if (index == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
    RETURN_IF_ERROR(store_->Set(key, HexEncode(&id, sizeof(id))));
  } else {
    ASSIGN_OR_RETURN(std::string hex, store_->Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    RETURN_IF_ERROR(HexDecode(hex, &id, sizeof(id)));
  }
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  const std::string what = absl::StrCat("NCCL communicator of ranks {", absl::StrJoin(ranks, ","), "}");
  ncclResult_t r = ncclCommInitRankConfig(&comm, static_cast<int>(ranks.size()), id, index, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclError(r, what);
  }
  // Not yet visible to Abort: polled here directly, watching for an abort.
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      ncclCommAbort(comm);
      return NcclError(r != ncclSuccess ? r : state, what);
    }
    if (state == ncclSuccess) return comm;
    if (aborted()) {
      ncclCommAbort(comm);
      return absl::AbortedError(absl::StrCat(what, ": communicator aborted while it was being created"));
    }
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not every rank joined within the deadline (store key ", key, ")"));
    }
    backoff.Pause();
  }
}

absl::Status Core::InitWorld() {
  std::vector<int> ranks(options_.size);
  for (int r = 0; r < options_.size; ++r) ranks[r] = r;
  ASSIGN_OR_RETURN(ncclComm_t comm, InitComm(absl::StrCat(options_.job_prefix, "/nccl/world"), ranks, options_.rank,
                                             absl::Now() + options_.connect_timeout));
  MutexLock l(&mu_);
  world_ = comm;
  return absl::OkStatus();
}

absl::StatusOr<cudaStream_t> Core::StreamFor(int peer, Direction dir) {
  auto [it, inserted] = streams_.try_emplace({peer, dir}, nullptr);
  if (inserted) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&it->second, cudaStreamNonBlocking); e != cudaSuccess) {
      streams_.erase(it);
      return cuda::CudaStatus(e, "cudaStreamCreateWithFlags");
    }
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Op>> Core::StartP2P(Direction dir, int peer, void* data, size_t bytes) {
  auto op = std::make_shared<Op>();
  op->peer = peer;
  op->dir = dir;
  op->data = data;
  op->bytes = bytes;
  op->label = absl::StrCat(dir == Direction::kSend ? "send of " : "receive of ", bytes,
                           dir == Direction::kSend ? " bytes to rank " : " bytes from rank ", peer);
  if (peer < 0 || peer >= options_.size) {
    return absl::InvalidArgumentError(absl::StrCat(op->label, ": no such rank (world size ", options_.size, ")"));
  }
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) return cuda::CudaStatus(e, "cudaSetDevice");
  MutexLock l(&mu_);
  if (aborted_) return AbortedLocked(op->label);
  ASSIGN_OR_RETURN(op->stream, StreamFor(peer, dir));
  // The transfer must see the data the compute stream produces up to now.
  RETURN_IF_ERROR(Order(options_.compute_stream, op->stream));
  if (cudaError_t e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda::CudaStatus(e, "cudaEventCreateWithFlags");
  }
  pending_.push_back(op);
  unfinished_.insert(op.get());
  return op;
}

absl::Status Core::Launch() {
  std::vector<std::shared_ptr<Op>> ops;
  ncclResult_t r = ncclSuccess;
  std::string what;
  int peer = -1;  // the one peer of every op, if they share one
  {
    MutexLock l(&mu_);
    if (pending_.empty()) return absl::OkStatus();
    ops.swap(pending_);
    peer = ops.front()->peer;
    for (const auto& op : ops) peer = op->peer == peer ? peer : -1;
    what = ops.size() == 1 ? ops.front()->label : absl::StrCat(ops.size(), " transfers starting with ", ops.front()->label);
    if (aborted_) {
      const absl::Status s = AbortedLocked(what);
      for (const auto& op : ops) FinishLocked(op.get(), s);
      return s;
    }
    // NCCL's group state is per thread: opened and closed within this call,
    // so no group is ever left open across our API (an abort inside an open
    // NCCL group would only be queued).
    ncclResult_t issue = ncclGroupStart();
    for (size_t i = 0; issue == ncclSuccess && i < ops.size(); ++i) {
      const Op& op = *ops[i];
      issue = op.dir == Direction::kSend ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, world_, op.stream)
                                         : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, world_, op.stream);
      if (issue == ncclInProgress) issue = ncclSuccess;
    }
    r = ncclGroupEnd();
    if (issue != ncclSuccess) r = issue;
    if (r != ncclSuccess && r != ncclInProgress) {
      const absl::Status s = Tag(NcclError(r, what), peer);
      AbortLocked(s);
      for (const auto& op : ops) FinishLocked(op.get(), s);
      mu_.Unlock();
      CompleteAbort();
      mu_.Lock();
      return s;
    }
  }
  if (r == ncclInProgress) {
    // The kernels are enqueued once the communicator's state leaves
    // ncclInProgress; the completion events must follow them.
    const absl::Status settled = Tag(Settle(&world_, absl::Now() + options_.connect_timeout, what), peer);
    if (!settled.ok()) {
      {
        MutexLock l(&mu_);
        AbortLocked(settled);
        for (const auto& op : ops) FinishLocked(op.get(), settled);
      }
      CompleteAbort();
      return settled;
    }
  }
  absl::Status failed;
  {
    MutexLock l(&mu_);
    for (const auto& op : ops) {
      if (op->finished) continue;  // dropped meanwhile by another thread's abort
      if (cudaError_t e = cudaEventRecord(op->done, op->stream); e != cudaSuccess) {
        failed = cuda::CudaStatus(e, "cudaEventRecord");
        break;
      }
      op->launched = true;
    }
    if (!failed.ok()) {
      // The transfers are running and nobody could tell when they end.
      AbortLocked(failed);
      for (const auto& op : ops) FinishLocked(op.get(), failed);
    }
  }
  if (!failed.ok()) CompleteAbort();
  return failed;
}

absl::Status Core::GroupStart() {
  MutexLock l(&mu_);
  if (aborted_) return AbortedLocked("group start");
  if (in_group_) return absl::FailedPreconditionError("GroupStart inside a group (groups do not nest)");
  in_group_ = true;
  return absl::OkStatus();
}

absl::Status Core::GroupEnd() {
  {
    MutexLock l(&mu_);
    if (!in_group_) return absl::FailedPreconditionError("GroupEnd without GroupStart");
    in_group_ = false;
  }
  return Launch();
}

void Core::Finish(Op* op, absl::Status result) {
  MutexLock l(&mu_);
  FinishLocked(op, std::move(result));
}

void Core::FinishLocked(Op* op, absl::Status result) {
  if (op->finished) return;
  op->finished = true;
  op->result = std::move(result);
  unfinished_.erase(op);
}

absl::Status Core::Wait(Op* op, absl::Time deadline) {
  {
    MutexLock l(&mu_);
    if (op->finished) return op->result;
    if (!op->launched && in_group_) {
      return absl::FailedPreconditionError(absl::StrCat(op->label, ": waited on before GroupEnd"));
    }
  }
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    Finish(op, cuda::CudaStatus(e, "cudaSetDevice"));
    return op->result;
  }
  // Transfers not yet handed to NCCL go now, together with every other
  // pending one (so an exchange's send and receive are one group).
  if (absl::Status s = Launch(); !s.ok()) {
    Finish(op, s);  // no-op when Launch finished it already
    MutexLock l(&mu_);
    return op->result;
  }
  Backoff backoff;
  for (;;) {
    bool abort = false;
    {
      MutexLock l(&mu_);
      if (op->finished) return op->result;
      if (!op->launched) {  // launched by nobody: the core was aborted before
        FinishLocked(op, AbortedLocked(op->label));
        return op->result;
      }
      // After an abort a transfer's event may still complete (NCCL's kernels
      // exit early when aborted), which says nothing about its data: every
      // transfer not seen complete before the abort ends ABORTED, naming the
      // cause (the failure elsewhere that aborted the communicator).
      if (aborted_) {
        FinishLocked(op, AbortedLocked(op->label));
        return op->result;
      }
      const cudaError_t q = cudaEventQuery(op->done);
      if (q == cudaSuccess) {
        FinishLocked(op, absl::OkStatus());
        return op->result;
      }
      if (q != cudaErrorNotReady) {
        const absl::Status s = cuda::CudaStatus(q, op->label);
        AbortLocked(s);
        FinishLocked(op, s);
        abort = true;
      } else {
        ncclComm_t comm = world_;
        if (!op->group.empty()) {
          const auto g = groups_.find(op->group);
          comm = g == groups_.end() ? nullptr : g->second.comm;
        }
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = comm == nullptr ? ncclInvalidUsage : ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
          const absl::Status s = Tag(NcclError(r != ncclSuccess ? r : state, op->label), op->peer);
          AbortLocked(s);
          FinishLocked(op, s);
          abort = true;
        } else if (absl::Now() >= deadline) {
          const absl::Status s =
              Tag(absl::DeadlineExceededError(absl::StrCat(op->label, ": not complete by its deadline")), op->peer);
          AbortLocked(s);
          FinishLocked(op, s);
          abort = true;
        }
      }
    }
    if (abort) {
      CompleteAbort();
      MutexLock l(&mu_);
      return op->result;
    }
    backoff.Pause();
  }
}

void Core::Drop(Op* op) {
  bool abort = false;
  {
    MutexLock l(&mu_);
    if (!op->finished) {
      if (!op->launched) {
        // Never handed to NCCL: forget it (nothing will touch its buffer).
        pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                      [op](const std::shared_ptr<Op>& p) { return p.get() == op; }),
                       pending_.end());
      } else if (!aborted_ && cudaEventQuery(op->done) == cudaErrorNotReady) {
        AbortLocked(absl::AbortedError(absl::StrCat(op->label, ": request destroyed before its transfer completed")));
        abort = true;
      }
      FinishLocked(op, absl::CancelledError("dropped"));
    }
  }
  if (abort) CompleteAbort();
  if (op->done != nullptr) cudaEventDestroy(op->done);  // released once any recorded work completes
  op->done = nullptr;
}

template <typename T>
absl::StatusOr<std::shared_ptr<Op>> Core::StartAllReduce(absl::Span<const int> group, T* data, size_t n,
                                                         absl::Time deadline) {
  constexpr ncclDataType_t type = std::is_same_v<T, float> ? ncclFloat32 : ncclFloat64;
  return StartCollective(group, "all-reduce", n, deadline, [=](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(data, data, n, type, ncclSum, comm, stream);
  });
}

absl::StatusOr<std::shared_ptr<Op>> Core::StartSharded(absl::Span<const int> group, float* data,
                                                       absl::Span<const size_t> counts, bool gather,
                                                       absl::Time deadline) {
  if (counts.size() != group.size()) {
    return absl::InvalidArgumentError(absl::StrCat(gather ? "all-gather" : "reduce-scatter", ": ", counts.size(),
                                                   " shard counts for a group of ", group.size()));
  }
  size_t n = 0;
  for (size_t c : counts) n += c;
  std::vector<size_t> shards(counts.begin(), counts.end());
  // Uneven shards: one root per shard, in one NCCL group (member i of the
  // sorted group is the group communicator's rank i). ncclReduce adds the
  // members' shards into member i's copy; ncclBroadcast sends member i's
  // shard to everyone (in place on every rank).
  return StartCollective(group, gather ? "all-gather" : "reduce-scatter", n, deadline,
                         [=](ncclComm_t comm, cudaStream_t stream) {
                           ncclResult_t r = ncclGroupStart();
                           size_t offset = 0;
                           for (size_t i = 0; r == ncclSuccess && i < shards.size(); ++i) {
                             if (shards[i] > 0) {
                               float* shard = data + offset;
                               const int root = static_cast<int>(i);
                               r = gather ? ncclBroadcast(shard, shard, shards[i], ncclFloat32, root, comm, stream)
                                          : ncclReduce(shard, shard, shards[i], ncclFloat32, ncclSum, root, comm,
                                                       stream);
                               if (r == ncclInProgress) r = ncclSuccess;
                             }
                             offset += shards[i];
                           }
                           const ncclResult_t end = ncclGroupEnd();
                           return r != ncclSuccess ? r : end;
                         });
}

absl::StatusOr<std::shared_ptr<Op>> Core::StartCollective(absl::Span<const int> group, absl::string_view kind,
                                                          size_t n, absl::Time deadline,
                                                          const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>&
                                                              issue) {
  std::vector<int> ranks(group.begin(), group.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  const auto me = std::find(ranks.begin(), ranks.end(), options_.rank);
  const std::string what =
      absl::StrCat(kind, " of ", n, " values over ranks {", absl::StrJoin(ranks, ","), "}");
  if (me == ranks.end()) return absl::InvalidArgumentError(absl::StrCat(what, ": this rank is not a member"));
  if (ranks.size() != group.size()) return absl::InvalidArgumentError(absl::StrCat(what, ": a rank repeats"));
  if (ranks.front() < 0 || ranks.back() >= options_.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank out of range"));
  }
  auto op = std::make_shared<Op>();
  op->label = what;
  op->group = ranks;
  if (n == 0) {
    op->finished = true;  // nothing to reduce
    return op;
  }
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) return cuda::CudaStatus(e, "cudaSetDevice");
  bool exists;
  {
    MutexLock l(&mu_);
    if (aborted_) return AbortedLocked(what);
    if (in_group_) return absl::FailedPreconditionError(absl::StrCat(what, ": inside a transfer group"));
    exists = groups_.count(ranks) > 0;
  }
  // Pending transfers go first: every rank issues its NCCL work in its
  // program order.
  RETURN_IF_ERROR(Launch());
  if (!exists) {
    const std::string key = absl::StrCat(options_.job_prefix, "/nccl/group/", absl::StrJoin(ranks, "-"));
    absl::StatusOr<ncclComm_t> comm = InitComm(key, ranks, static_cast<int>(me - ranks.begin()),
                                               std::min(deadline, absl::Now() + options_.connect_timeout));
    if (!comm.ok()) {
      Abort(comm.status());
      return comm.status();
    }
    cudaStream_t stream = nullptr;
    absl::Status made;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      made = cuda::CudaStatus(e, "cudaStreamCreateWithFlags");
    }
    bool keep = false;
    {
      MutexLock l(&mu_);
      if (made.ok() && !aborted_) {
        groups_[ranks] = Group{*comm, stream};
        keep = true;
      } else if (made.ok()) {
        made = AbortedLocked(what);
      }
    }
    if (!keep) {
      ncclCommAbort(*comm);
      if (stream != nullptr) cudaStreamDestroy(stream);
      Abort(made);
      return made;
    }
  }
  ncclComm_t* comm = nullptr;
  ncclResult_t r;
  {
    MutexLock l(&mu_);
    if (aborted_) return AbortedLocked(what);
    Group& g = groups_[ranks];
    op->stream = g.stream;
    comm = &g.comm;
    RETURN_IF_ERROR(Order(options_.compute_stream, g.stream));
    if (cudaError_t e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming); e != cudaSuccess) {
      op->done = nullptr;
      return cuda::CudaStatus(e, "cudaEventCreateWithFlags");
    }
    r = issue(g.comm, g.stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      const absl::Status s = NcclError(r, what);
      AbortLocked(s);
      mu_.Unlock();
      CompleteAbort();
      mu_.Lock();
      cudaEventDestroy(op->done);
      op->done = nullptr;
      return s;
    }
    unfinished_.insert(op.get());
  }
  absl::Status s;
  if (r == ncclInProgress) s = Settle(comm, deadline, what);
  if (s.ok()) {
    MutexLock l(&mu_);
    if (cudaError_t e = cudaEventRecord(op->done, op->stream); e != cudaSuccess) {
      s = cuda::CudaStatus(e, "cudaEventRecord");
    } else {
      op->launched = true;
    }
  }
  if (!s.ok()) {
    {
      MutexLock l(&mu_);
      AbortLocked(s);
      FinishLocked(op.get(), s);
    }
    CompleteAbort();
    Drop(op.get());  // finished: releases the event
    return s;
  }
  return op;
}

void Core::AbortLocked(absl::Status cause) {
  if (aborted_) return;
  aborted_ = true;
  cause_ = std::move(cause);
  spdlog::warn("rank {}: aborting NCCL communicators: {}", options_.rank, cause_.message());
  if (world_ != nullptr) to_abort_.push_back(std::exchange(world_, nullptr));
  for (auto& [ranks, g] : groups_) {
    if (g.comm != nullptr) to_abort_.push_back(std::exchange(g.comm, nullptr));
  }
  // Transfers never handed to NCCL just end.
  for (const auto& op : pending_) FinishLocked(op.get(), AbortedLocked(op->label));
  pending_.clear();
}

void Core::CompleteAbort() {
  std::vector<ncclComm_t> comms;
  {
    MutexLock l(&mu_);
    comms.swap(to_abort_);
    if (comms.empty()) {
      // Another thread is running ncclCommAbort: wait for it (bounded; a
      // hung abort is NCCL's bug, not a reason to hang every caller).
      if (aborted_) mu_.AwaitWithDeadline([this]() { return abort_done_; }, absl::Now() + absl::Seconds(60));
      return;
    }
  }
  // Stops the communicators' kernels and proxy threads; once it returns NCCL
  // no longer touches any buffer. Outside the lock: it may take a while.
  for (ncclComm_t c : comms) ncclCommAbort(c);
  MutexLock l(&mu_);
  abort_done_ = true;
}

void Core::Abort(absl::Status cause) {
  {
    MutexLock l(&mu_);
    AbortLocked(std::move(cause));
  }
  CompleteAbort();
}

void Core::Shutdown() {
  std::vector<ncclComm_t> comms;
  {
    MutexLock l(&mu_);
    if (aborted_) {
      mu_.Unlock();
      CompleteAbort();
      mu_.Lock();
      return;
    }
    int running = 0;
    for (Op* op : unfinished_) running += op->launched && cudaEventQuery(op->done) == cudaErrorNotReady;
    if (running > 0) {
      AbortLocked(absl::AbortedError(absl::StrCat("communicator destroyed with ", running, " transfer(s) in flight")));
      mu_.Unlock();
      CompleteAbort();
      mu_.Lock();
      return;
    }
    // Requests not yet launched end here; launched ones have completed.
    for (const auto& op : pending_) FinishLocked(op.get(), absl::CancelledError("communicator destroyed"));
    pending_.clear();
    if (world_ != nullptr) comms.push_back(std::exchange(world_, nullptr));
    for (auto& [ranks, g] : groups_) {
      if (g.comm != nullptr) comms.push_back(std::exchange(g.comm, nullptr));
    }
    aborted_ = true;
    abort_done_ = true;
    cause_ = absl::CancelledError("communicator destroyed");
  }
  // Graceful: flush what was issued, bounded so a dead peer cannot hold us.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (ncclComm_t c : comms) {
    ncclResult_t r = ncclCommFinalize(c);
    ncclResult_t state = r;
    Backoff backoff;
    while (r == ncclSuccess || r == ncclInProgress) {
      if (ncclCommGetAsyncError(c, &state) != ncclSuccess || state != ncclInProgress || absl::Now() >= deadline) break;
      backoff.Pause();
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(c);
    } else {
      ncclCommAbort(c);
    }
  }
}

Core::~Core() {
  MutexLock l(&mu_);
  for (auto& [key, s] : streams_) cudaStreamDestroy(s);
  for (auto& [ranks, g] : groups_) {
    if (g.stream != nullptr) cudaStreamDestroy(g.stream);
  }
}

class NcclRequest final : public Request {
 public:
  NcclRequest(std::shared_ptr<Core> core, std::shared_ptr<Op> op) : core_(std::move(core)), op_(std::move(op)) {}
  ~NcclRequest() override { core_->Drop(op_.get()); }
  absl::Status Wait(absl::Time deadline) override { return core_->Wait(op_.get(), deadline); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<Op> op_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~NcclCommunicator() override { core_->Shutdown(); }

  int rank() const override { return core_->options().rank; }
  int size() const override { return core_->options().size; }

  absl::StatusOr<std::unique_ptr<Request>> Send(int peer, uint64_t /*tag*/, const void* data,
                                                size_t bytes) override {
    ASSIGN_OR_RETURN(auto op, core_->StartP2P(Direction::kSend, peer, const_cast<void*>(data), bytes));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  absl::StatusOr<std::unique_ptr<Request>> Recv(int peer, uint64_t /*tag*/, void* data, size_t bytes) override {
    ASSIGN_OR_RETURN(auto op, core_->StartP2P(Direction::kRecv, peer, data, bytes));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  absl::Status GroupStart() override { return core_->GroupStart(); }
  absl::Status GroupEnd() override { return core_->GroupEnd(); }
  absl::Status AllReduceSum(absl::Span<const int> group, float* data, size_t n, absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, double* data, size_t n, absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  // Enqueued on the group's stream; the caller goes on while it runs.
  absl::StatusOr<std::unique_ptr<Request>> StartAllReduceSum(absl::Span<const int> group, float* data, size_t n,
                                                             absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto op, core_->StartAllReduce(group, data, n, deadline));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  bool overlaps_collectives() const override { return true; }
  absl::StatusOr<std::unique_ptr<Request>> StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                 absl::Span<const size_t> counts,
                                                                 absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto op, core_->StartSharded(group, data, counts, /*gather=*/false, deadline));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllGather(absl::Span<const int> group, float* data,
                                                          absl::Span<const size_t> counts,
                                                          absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto op, core_->StartSharded(group, data, counts, /*gather=*/true, deadline));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  void Abort() override { core_->Abort(absl::AbortedError("aborted by the caller")); }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

std::string HexEncode(const void* data, size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * bytes, '0');
  for (size_t i = 0; i < bytes; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

absl::Status HexDecode(absl::string_view hex, void* out, size_t bytes) {
  if (hex.size() != 2 * bytes) {
    return absl::DataLossError(absl::StrCat("hex id of ", hex.size(), " characters, expected ", 2 * bytes));
  }
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::DataLossError(absl::StrCat("hex id has a non-hex character at ", 2 * i));
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                     KeyValueStore* store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL rank ", options.rank, " of world size ", options.size));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return cuda::CudaStatus(e, absl::StrCat("cudaSetDevice(", options.device, ")"));
  }
  auto core = std::make_shared<Core>(options, store);
  RETURN_IF_ERROR(core->InitWorld());
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(core)));
}

}  // namespace dynapipe::runtime::comm
