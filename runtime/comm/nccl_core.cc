#include "runtime/comm/nccl_core.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_join.h"
#include "runtime/device/cuda_status.h"
#include "src/common/logging.h"

namespace dynapipe::runtime::comm::nccl_internal {
namespace {

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

// A failure tagged with the lost peer, except aborts: those repeat a cause
// found elsewhere (AbortedLocked carries that cause's peer, if any).
absl::Status Tag(absl::Status s, int peer) {
  if (peer < 0 || s.ok() || absl::IsAborted(s)) return s;
  return WithLostPeer(std::move(s), peer);
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with deadlines
  return config;
}

}  // namespace

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(r));
  // A remote or system error is the network or a peer failing, not a bug here.
  if (r == ncclRemoteError || r == ncclSystemError) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

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

}  // namespace dynapipe::runtime::comm::nccl_internal
