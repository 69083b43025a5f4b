#include "runtime/comm/nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
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
    return CudaError(e, "cudaEventCreateWithFlags");
  }
  cudaError_t e = cudaEventRecord(ready, producer);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(consumer, ready, 0);
  cudaEventDestroy(ready);  // released once the wait has been satisfied
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "ordering the transfer after the compute stream");
}

// One transfer or collective in flight. Owned by its Request (or the
// collective's stack frame); `launched` and `done` are set under the core's
// mutex, the rest by the waiting thread.
struct Op {
  std::string label;   // "send of 4096 bytes to rank 1"
  int peer = -1;       // -1 for collectives
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;  // recorded after the NCCL call(s)
  bool launched = false;       // done has been recorded
  bool finished = false;
  absl::Status result;
};

class Core {
 public:
  Core(const NcclOptions& o, KeyValueStore* store) : options_(o), store_(store) {}
  ~Core();

  const NcclOptions& options() const { return options_; }
  absl::Status InitWorld();
  absl::StatusOr<std::shared_ptr<Op>> StartP2P(Direction dir, int peer, void* data, size_t bytes);
  template <typename T>
  absl::Status AllReduceSum(absl::Span<const int> group, T* data, size_t n, absl::Time deadline);
  absl::Status GroupStart();
  absl::Status GroupEnd();
  // Polls `op` to completion, an error or the deadline; `group` (null: the
  // world) names the communicator whose asynchronous errors concern it.
  // Finishes the op on every path except a wait before GroupEnd.
  absl::Status Wait(Op* op, absl::Time deadline, const std::vector<int>* group);
  // Releases a request's op; aborts when its transfer may still be running.
  void Drop(Op* op);
  void Abort(absl::Status cause);
  void Shutdown();

 private:
  struct Group {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  absl::StatusOr<ncclComm_t> InitComm(absl::string_view key, const std::vector<int>& ranks, int index,
                                      absl::Time deadline);
  // Polls `*comm` (re-read under the lock each time: Abort nulls it) until
  // its pending operation settles.
  absl::Status Settle(ncclComm_t* comm, absl::Time deadline, absl::string_view what);
  absl::StatusOr<cudaStream_t> StreamFor(int peer, Direction dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AbortedLocked(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status s = absl::AbortedError(absl::StrCat(what, ": communicator aborted: ", cause_.message()));
    if (auto peer = LostPeer(cause_)) s = WithLostPeer(std::move(s), *peer);
    return s;
  }
  void AbortLocked(absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Op* op, absl::Status result);
  void FinishLocked(Op* op, absl::Status result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NcclOptions options_;
  KeyValueStore* const store_;
  Mutex mu_;
  ncclComm_t world_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::vector<int>, Group> groups_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, Direction>, cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status cause_ ABSL_GUARDED_BY(mu_);
  std::set<Op*> unfinished_ ABSL_GUARDED_BY(mu_);  // started, not yet finished
  bool in_group_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Op>> group_ops_ ABSL_GUARDED_BY(mu_);
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
  if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, what);
  // Not yet visible to Abort: poll it here directly.
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      ncclCommAbort(comm);
      return NcclError(r != ncclSuccess ? r : state, what);
    }
    if (state == ncclSuccess) return comm;
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
      return CudaError(e, "cudaStreamCreateWithFlags");
    }
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Op>> Core::StartP2P(Direction dir, int peer, void* data, size_t bytes) {
  auto op = std::make_shared<Op>();
  op->peer = peer;
  op->label = absl::StrCat(dir == Direction::kSend ? "send of " : "receive of ", bytes,
                           dir == Direction::kSend ? " bytes to rank " : " bytes from rank ", peer);
  if (peer < 0 || peer >= options_.size) {
    return absl::InvalidArgumentError(absl::StrCat(op->label, ": no such rank (world size ", options_.size, ")"));
  }
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
  ncclResult_t r;
  {
    MutexLock l(&mu_);
    if (aborted_) return AbortedLocked(op->label);
    ASSIGN_OR_RETURN(op->stream, StreamFor(peer, dir));
    RETURN_IF_ERROR(Order(options_.compute_stream, op->stream));
    if (cudaError_t e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming); e != cudaSuccess) {
      return CudaError(e, "cudaEventCreateWithFlags");
    }
    r = dir == Direction::kSend ? ncclSend(data, bytes, ncclUint8, peer, world_, op->stream)
                                : ncclRecv(data, bytes, ncclUint8, peer, world_, op->stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      cudaEventDestroy(op->done);
      absl::Status s = WithLostPeer(NcclError(r, op->label), peer);
      AbortLocked(s);
      return s;
    }
    unfinished_.insert(op.get());
    if (in_group_) {
      group_ops_.push_back(op);  // launched by ncclGroupEnd; recorded then
      return op;
    }
  }
  // Outside a group a non-blocking call may still be settling: the transfer
  // is enqueued once the communicator's state leaves ncclInProgress, and the
  // completion event must follow the enqueued kernel.
  if (r == ncclInProgress) {
    const absl::Status settled =
        WithLostPeer(Settle(&world_, absl::Now() + options_.connect_timeout, op->label), peer);
    if (!settled.ok()) {
      Abort(settled);
      Finish(op.get(), settled);
      cudaEventDestroy(op->done);
      return settled;
    }
  }
  MutexLock l(&mu_);
  if (cudaError_t e = cudaEventRecord(op->done, op->stream); e != cudaSuccess) return CudaError(e, "cudaEventRecord");
  op->launched = true;
  return op;
}

absl::Status Core::GroupStart() {
  MutexLock l(&mu_);
  if (aborted_) return AbortedLocked("group start");
  if (in_group_) return absl::FailedPreconditionError("GroupStart inside a group (groups do not nest)");
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return NcclError(r, "ncclGroupStart");
  in_group_ = true;
  return absl::OkStatus();
}

absl::Status Core::GroupEnd() {
  std::vector<std::shared_ptr<Op>> ops;
  ncclResult_t r;
  {
    MutexLock l(&mu_);
    if (!in_group_) return absl::FailedPreconditionError("GroupEnd without GroupStart");
    in_group_ = false;
    ops.swap(group_ops_);
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
      absl::Status s = NcclError(r, "ncclGroupEnd");
      AbortLocked(s);
      return s;
    }
  }
  if (r == ncclInProgress) {
    absl::Status s = Settle(&world_, absl::Now() + options_.connect_timeout, "ncclGroupEnd");
    if (!s.ok()) {
      Abort(s);
      return s;
    }
  }
  MutexLock l(&mu_);
  for (const auto& op : ops) {
    if (cudaError_t e = cudaEventRecord(op->done, op->stream); e != cudaSuccess) {
      return CudaError(e, "cudaEventRecord");
    }
    op->launched = true;
  }
  return absl::OkStatus();
}

void Core::Finish(Op* op, absl::Status result) {
  MutexLock l(&mu_);
  FinishLocked(op, std::move(result));
}

void Core::FinishLocked(Op* op, absl::Status result) {
  op->finished = true;
  op->result = std::move(result);
  unfinished_.erase(op);
}

absl::Status Core::Wait(Op* op, absl::Time deadline, const std::vector<int>* group) {
  if (op->finished) return op->result;
  {
    MutexLock l(&mu_);
    if (!op->launched) {
      if (aborted_) return AbortedLocked(op->label);
      return absl::FailedPreconditionError(absl::StrCat(op->label, ": waited on before GroupEnd"));
    }
  }
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    Finish(op, CudaError(e, "cudaSetDevice"));
    return op->result;
  }
  auto with_peer = [op](absl::Status s) { return op->peer >= 0 ? WithLostPeer(std::move(s), op->peer) : s; };
  Backoff backoff;
  for (;;) {
    const cudaError_t q = cudaEventQuery(op->done);
    if (q == cudaSuccess) {
      Finish(op, absl::OkStatus());
      return op->result;
    }
    if (q != cudaErrorNotReady) {
      absl::Status s = CudaError(q, op->label);
      Abort(s);
      Finish(op, s);
      return s;
    }
    {
      MutexLock l(&mu_);
      if (aborted_) {
        FinishLocked(op, AbortedLocked(op->label));
        return op->result;
      }
      ncclComm_t comm = world_;
      if (group != nullptr) comm = groups_[*group].comm;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = comm == nullptr ? ncclInvalidUsage : ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        absl::Status s = with_peer(NcclError(r != ncclSuccess ? r : state, op->label));
        AbortLocked(s);
        FinishLocked(op, s);
        return s;
      }
    }
    if (absl::Now() >= deadline) {
      absl::Status s = with_peer(
          absl::DeadlineExceededError(absl::StrCat(op->label, ": not complete by its deadline")));
      Abort(s);
      Finish(op, s);
      return s;
    }
    backoff.Pause();
  }
}

void Core::Drop(Op* op) {
  if (!op->finished) {
    bool running = false;
    {
      MutexLock l(&mu_);
      running = !aborted_ && (!op->launched || cudaEventQuery(op->done) == cudaErrorNotReady);
    }
    if (running) Abort(absl::AbortedError(absl::StrCat(op->label, ": request destroyed before its transfer completed")));
    Finish(op, absl::CancelledError("dropped"));
  }
  if (op->done != nullptr) cudaEventDestroy(op->done);
  op->done = nullptr;
}

template <typename T>
absl::Status Core::AllReduceSum(absl::Span<const int> group, T* data, size_t n, absl::Time deadline) {
  std::vector<int> ranks(group.begin(), group.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  const auto me = std::find(ranks.begin(), ranks.end(), options_.rank);
  const std::string what = absl::StrCat("all-reduce of ", n, " values over ranks {", absl::StrJoin(ranks, ","), "}");
  if (me == ranks.end()) return absl::InvalidArgumentError(absl::StrCat(what, ": this rank is not a member"));
  if (ranks.front() < 0 || ranks.back() >= options_.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank out of range"));
  }
  if (n == 0) return absl::OkStatus();
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
  bool exists;
  {
    MutexLock l(&mu_);
    if (aborted_) return AbortedLocked(what);
    if (in_group_) return absl::FailedPreconditionError(absl::StrCat(what, ": inside a transfer group"));
    exists = groups_.count(ranks) > 0;
  }
  if (!exists) {
    const std::string key = absl::StrCat(options_.job_prefix, "/nccl/group/", absl::StrJoin(ranks, "-"));
    absl::StatusOr<ncclComm_t> comm = InitComm(key, ranks, static_cast<int>(me - ranks.begin()),
                                               std::min(deadline, absl::Now() + options_.connect_timeout));
    if (!comm.ok()) {
      Abort(comm.status());
      return comm.status();
    }
    cudaStream_t stream;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      ncclCommAbort(*comm);
      return CudaError(e, "cudaStreamCreateWithFlags");
    }
    MutexLock l(&mu_);
    groups_[ranks] = Group{*comm, stream};
  }
  Op op;
  op.label = what;
  constexpr ncclDataType_t type = std::is_same_v<T, float> ? ncclFloat32 : ncclFloat64;
  bool settle = false;
  ncclComm_t* comm = nullptr;
  {
    MutexLock l(&mu_);
    if (aborted_) return AbortedLocked(what);
    Group& g = groups_[ranks];
    op.stream = g.stream;
    RETURN_IF_ERROR(Order(options_.compute_stream, g.stream));
    if (cudaError_t e = cudaEventCreateWithFlags(&op.done, cudaEventDisableTiming); e != cudaSuccess) {
      return CudaError(e, "cudaEventCreateWithFlags");
    }
    const ncclResult_t r = ncclAllReduce(data, data, n, type, ncclSum, g.comm, g.stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      cudaEventDestroy(op.done);
      absl::Status s = NcclError(r, what);
      AbortLocked(s);
      return s;
    }
    unfinished_.insert(&op);
    settle = r == ncclInProgress;
    comm = &g.comm;
  }
  if (settle) {
    if (absl::Status s = Settle(comm, deadline, what); !s.ok()) {
      Abort(s);
      Finish(&op, s);
      cudaEventDestroy(op.done);
      return s;
    }
  }
  {
    MutexLock l(&mu_);
    if (cudaError_t e = cudaEventRecord(op.done, op.stream); e != cudaSuccess) {
      FinishLocked(&op, CudaError(e, "cudaEventRecord"));
      cudaEventDestroy(op.done);
      return op.result;
    }
    op.launched = true;
  }
  absl::Status s = Wait(&op, deadline, &ranks);
  cudaEventDestroy(op.done);
  return s;
}

void Core::AbortLocked(absl::Status cause) {
  if (aborted_) return;
  aborted_ = true;
  cause_ = std::move(cause);
  spdlog::warn("rank {}: aborting NCCL communicators: {}", options_.rank, cause_.message());
  // ncclCommAbort stops the communicator's kernels and proxy threads; once
  // it returns NCCL no longer touches any buffer.
  if (world_ != nullptr) ncclCommAbort(world_);
  world_ = nullptr;
  for (auto& [ranks, g] : groups_) {
    if (g.comm != nullptr) ncclCommAbort(g.comm);
    g.comm = nullptr;
  }
}

void Core::Abort(absl::Status cause) {
  MutexLock l(&mu_);
  AbortLocked(std::move(cause));
}

void Core::Shutdown() {
  std::vector<ncclComm_t> comms;
  {
    MutexLock l(&mu_);
    if (aborted_) return;
    int running = 0;
    for (Op* op : unfinished_) running += !op->launched || cudaEventQuery(op->done) == cudaErrorNotReady;
    if (running > 0) {
      AbortLocked(absl::AbortedError(absl::StrCat("communicator destroyed with ", running, " transfer(s) in flight")));
      return;
    }
    if (world_ != nullptr) comms.push_back(std::exchange(world_, nullptr));
    for (auto& [ranks, g] : groups_) {
      if (g.comm != nullptr) comms.push_back(std::exchange(g.comm, nullptr));
    }
    aborted_ = true;
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
  absl::Status Wait(absl::Time deadline) override { return core_->Wait(op_.get(), deadline, nullptr); }

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
    return CudaError(e, absl::StrCat("cudaSetDevice(", options.device, ")"));
  }
  auto core = std::make_shared<Core>(options, store);
  RETURN_IF_ERROR(core->InitWorld());
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(core)));
}

}  // namespace dynapipe::runtime::comm
