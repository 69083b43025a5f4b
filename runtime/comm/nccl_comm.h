#pragma once

// The NCCL backend of Communicator, for device memory: pipeline transfers
// with ncclSend/ncclRecv, all-reduce over a communicator per data-parallel
// group, and waits that never outlast their deadline.
//
// - One world communicator per job attempt: rank 0 makes the unique id and
//   publishes it in the KeyValueStore (the planner's Bootstrap service in
//   production) under the job prefix; every rank initialises in NCCL's
//   non-blocking mode and polls, so initialisation too ends at
//   `connect_timeout`. Each all-reduce group gets its own communicator on its
//   first all-reduce (members only, id from the group's lowest rank) and its
//   own stream. StartAllReduceSum enqueues the collective there, after the
//   work queued on `compute_stream`, and returns at once (a gradient bucket
//   reduces while backward goes on: overlaps_collectives() is true); its
//   Wait polls like a transfer's. AllReduceSum starts and waits.
// - Launch: Send/Recv only record the transfer. Pending transfers are handed
//   to NCCL together, as one NCCL group, when the caller waits on any of
//   them, at GroupEnd, or before an all-reduce. NCCL point-to-point calls
//   block on the device until the peer's matching call runs, and NCCL
//   serialises a communicator's operations whatever the stream, so issuing
//   them one by one would deadlock an exchange (both ranks sending first);
//   grouping is what makes "start a send and a receive, then wait" work. A
//   plan's transfers overlap compute from the launch on: wrap a run of
//   start instructions in GroupStart/GroupEnd to launch them at once.
// - Ordering: data is produced and consumed by kernels on `compute_stream`.
//   Every transfer's stream waits for the work queued on `compute_stream`
//   when the transfer was started; Wait returns once the transfer finished on
//   the device, so kernels queued afterwards may use received data.
// - Matching: NCCL pairs the transfers between two ranks in the order they
//   are issued and ignores tags, so both ends must start their transfers in
//   the same order (the planner orders each pair's communication that way).
// - Failure: a wait polls the transfer's completion and
//   ncclCommGetAsyncError; an asynchronous NCCL error, a CUDA error or the
//   deadline aborts every communicator of this rank (ncclCommAbort, run
//   outside the lock so other threads' waits return ABORTED meanwhile), and
//   the failed wait names the operation and peer (WithLostPeer for
//   transfers; never on ABORTED, which only repeats a cause found elsewhere).
//   Every transfer not seen complete before the abort, and every later
//   operation, returns ABORTED with the cause (and the cause's peer): an
//   aborted kernel may still let a transfer's event complete, which says
//   nothing about its data. A wait in another thread returns at once; the
//   thread that aborts returns once NCCL no longer touches any buffer.
// - Threads: one thread issues operations; Abort may come from any thread.
//
// NCCL refuses two ranks on one GPU: tests on a single GPU run one rank
// (sends to itself, all-reduce over {0}).

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/comm.h"

namespace dynapipe::runtime::comm {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // Prefixes every store key; unique per job attempt.
  std::string job_prefix;
  // The CUDA device this rank drives (cudaSetDevice before every call).
  int device = 0;
  // Where the data passed to Send/Recv/AllReduceSum is produced and consumed.
  // Null: the legacy default stream.
  cudaStream_t compute_stream = nullptr;
  // Bounds initialising the world communicator and each group's.
  absl::Duration connect_timeout = kDefaultConnectTimeout;
};

// Creates rank `options.rank`'s world communicator; blocks until every rank
// has joined or connect_timeout passes (DEADLINE_EXCEEDED naming the store
// key or NCCL's state). `store` must outlive the communicator.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                     KeyValueStore* store);

// Hex text of NCCL's 128-byte unique id, so it travels through stores whose
// values are text (the Bootstrap service's, Redis). Exposed for tests.
std::string HexEncode(const void* data, size_t bytes);
absl::Status HexDecode(absl::string_view hex, void* out, size_t bytes);

}  // namespace dynapipe::runtime::comm
