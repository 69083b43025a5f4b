#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/nccl_core.h"
#include "runtime/device/cuda_status.h"
#include "src/common/status_macros.h"

// Collectives over data-parallel groups: each group's communicator and
// stream, made on its first collective, and the collectives enqueued there.

namespace dynapipe::runtime::comm::nccl_internal {

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
  if (!exists) RETURN_IF_ERROR(CreateGroup(ranks, static_cast<int>(me - ranks.begin()), deadline, what));
  RETURN_IF_ERROR(IssueCollective(op, ranks, deadline, what, issue));
  return op;
}

absl::Status Core::CreateGroup(const std::vector<int>& ranks, int index, absl::Time deadline,
                               const std::string& what) {
  const std::string key = absl::StrCat(options_.job_prefix, "/nccl/group/", absl::StrJoin(ranks, "-"));
  absl::StatusOr<ncclComm_t> comm =
      InitComm(key, ranks, index, std::min(deadline, absl::Now() + options_.connect_timeout));
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
  return absl::OkStatus();
}

absl::Status Core::IssueCollective(const std::shared_ptr<Op>& op, const std::vector<int>& ranks, absl::Time deadline,
                                   const std::string& what,
                                   const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& issue) {
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
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::comm::nccl_internal
