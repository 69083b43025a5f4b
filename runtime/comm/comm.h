#pragma once

// Communication between executor processes: point-to-point transfers for the
// pipeline (activations forward, gradients backward) and in-place sums for
// data parallelism. Backends (Gloo over TCP for host memory, NCCL for device
// memory) implement Communicator; processes find each other through a
// KeyValueStore.
//
// Failure model: the first failed transfer or collective aborts the whole
// communicator (its connections are closed, so peers fail fast instead of
// waiting out their deadlines); that operation reports what failed and every
// later one returns ABORTED naming the cause. Recovery means a new
// communicator under a new job prefix, not retrying on this one.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dynapipe::runtime::comm {

// How long a rank waits for its job's peers to join a communicator (Gloo's
// rendezvous, NCCL's unique id and init), and the deadline of every transfer
// and collective wait. The executor's --comm-timeout-s and every options
// struct below take them from here.
inline constexpr absl::Duration kDefaultConnectTimeout = absl::Seconds(60);
inline constexpr absl::Duration kDefaultCommTimeout = absl::Seconds(60);

// A failure caused by losing one peer (its connection failed, or a wait on it
// ran out) carries that peer's rank. Losing a peer is not proof it died: a
// peer that aborted after its own loss looks the same. Whoever collects a
// job's failures tells the two apart (planner/service/failures.h).
absl::Status WithLostPeer(absl::Status status, int peer);
std::optional<int> LostPeer(const absl::Status& status);  // nullopt if none

// Even shards of n elements over `members`: member `index` (0-based) gets
// [ShardBegin(n, members, index), ShardBegin(n, members, index + 1)), the
// first n % members shards one element longer.
size_t ShardBegin(size_t n, int members, int index);

// Rendezvous: where ranks publish and look up each other's addresses.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Stores `value` under `key`, replacing any earlier value.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value of `key`, waiting up to `wait` for it to be set; DEADLINE_EXCEEDED
  // when it is not set in time.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration wait) = 0;
};

// A started transfer. Not thread-safe itself, except that its communicator's
// Abort() may run concurrently with Wait().
class Request {
 public:
  // Destroying a request whose transfer has not completed aborts the
  // communicator (its bytes could still arrive, and the backend would stall
  // the connection or write into memory the caller has released).
  virtual ~Request() = default;
  // Waits for the transfer: OK once it completed; DEADLINE_EXCEEDED when
  // `deadline` passes first, ABORTED after Abort(), UNAVAILABLE when the
  // connection to the peer failed (messages name the operation, peer rank and
  // byte count). Errors are final, and after any return the backend no longer
  // touches the buffer. A later call returns the same result.
  virtual absl::Status Wait(absl::Time deadline) = 0;
};

class Communicator {
 public:
  // Aborts transfers still in flight (see Request); otherwise closes the
  // connections gracefully, so bytes already sent still reach the peers.
  // Requests may outlive their communicator.
  virtual ~Communicator() = default;

  // This process's rank in [0, size()).
  virtual int rank() const = 0;
  // Number of ranks in the world.
  virtual int size() const = 0;

  // Starts sending `bytes` from `data` to rank `peer`; `data` must stay alive
  // and unchanged until Wait returns. The receiver posts a Recv with the same
  // tag and the same byte count (a mismatch is a bug the backend may not
  // report: Gloo aborts the receiving process when the send is larger).
  // Transfers between one pair in one direction with one tag are matched in
  // the order they were started. Do not count on a send completing before
  // its Recv is posted (Gloo's do not).
  virtual absl::StatusOr<std::unique_ptr<Request>> Send(int peer, uint64_t tag, const void* data,
                                                        size_t bytes) = 0;
  // Starts receiving `bytes` from rank `peer` into `data` (alive until Wait
  // returns). The sender's byte count must be the same.
  virtual absl::StatusOr<std::unique_ptr<Request>> Recv(int peer, uint64_t tag, void* data,
                                                        size_t bytes) = 0;

  // Transfers started between GroupStart() and GroupEnd() are issued
  // together. NCCL launches them as one operation, so transfers that depend
  // on each other (both directions of an exchange with one peer, a send to
  // oneself) cannot deadlock; their requests may be waited on only after
  // GroupEnd. Gloo needs no grouping (no-ops). Groups do not nest.
  virtual absl::Status GroupStart() { return absl::OkStatus(); }
  virtual absl::Status GroupEnd() { return absl::OkStatus(); }

  // Replaces data[0, n) by its element-wise sum over the global ranks in
  // `group`, blocking until done or `deadline`. Every member calls with the
  // same group (any order) and n, and the caller must be a member; members
  // must reach their groups' first all-reduces in the same order. Results are
  // bitwise identical on every member.
  virtual absl::Status AllReduceSum(absl::Span<const int> group, float* data, size_t n,
                                    absl::Time deadline) = 0;
  virtual absl::Status AllReduceSum(absl::Span<const int> group, double* data, size_t n,
                                    absl::Time deadline) = 0;

  // Collectives that return at once. Each Start* returns a Request that
  // completes when the collective has; `data` must stay alive until then and
  // is not to be touched meanwhile. A rank's collectives run one at a time,
  // in the order it started them (blocking AllReduceSum included), so members
  // must start a group's collectives in the same order. `deadline` bounds the
  // collective's own transfers; Wait's deadline bounds the wait.
  //
  // StartAllReduceSum: as AllReduceSum. The other two cut data into
  // consecutive shards, counts[i] elements for member i (its position in the
  // sorted group; counts sum to the data's length and may be 0).
  // StartReduceScatterSum: afterwards member i holds the sum over the group
  // of its shard; the rest of data is unspecified. StartAllGather:
  // afterwards every member holds each member's shard as that member had it.
  // Every element of a sum adds the members' values in member order, so an
  // all-reduce, and a reduce-scatter followed by an all-gather, give the
  // same bits whatever the split into calls and shards. The defaults run the
  // blocking AllReduceSum before returning (a reduce-scatter then leaves
  // every shard's sum everywhere) and have no all-gather (UNIMPLEMENTED);
  // backends that can overlap override them.
  virtual absl::StatusOr<std::unique_ptr<Request>> StartAllReduceSum(absl::Span<const int> group, float* data,
                                                                     size_t n, absl::Time deadline);
  // Whether started collectives run while the caller goes on (false: the
  // defaults, which block; a caller should then start them where blocking
  // is safe, not in the middle of a pipeline's transfers).
  virtual bool overlaps_collectives() const { return false; }
  virtual absl::StatusOr<std::unique_ptr<Request>> StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                         absl::Span<const size_t> counts,
                                                                         absl::Time deadline);
  virtual absl::StatusOr<std::unique_ptr<Request>> StartAllGather(absl::Span<const int> group, float* data,
                                                                  absl::Span<const size_t> counts,
                                                                  absl::Time deadline);

  // Thread-safe, from any thread: pending and future waits and collectives
  // return ABORTED promptly, and connections are closed so that peers' waits
  // on this rank fail instead of running into their deadlines. Returns once
  // the backend no longer touches any request's buffer.
  virtual void Abort() = 0;
};

}  // namespace dynapipe::runtime::comm
