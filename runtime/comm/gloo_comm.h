#pragma once

// The Gloo backend of Communicator: TCP connections between every pair of
// ranks (Gloo's full mesh), found through a KeyValueStore.
//
// Send/Recv use the world mesh, with the tag as Gloo's slot. Each distinct
// all-reduce group gets its own mesh, connected on that group's first
// AllReduceSum (so members must reach their groups' first all-reduces in the
// same order) under store keys derived from the sorted group ranks; keeping
// collectives off the world mesh leaves the whole uint64 tag space to
// Send/Recv. Collectives run on one thread per communicator, in start order
// (so Start* return at once and overlap the caller's work), as a direct
// exchange over the group's mesh run over our own abortable transfers rather
// than gloo::allreduce, whose internal waits neither honour an absolute
// deadline nor can be interrupted by Abort(): each member receives every
// other member's copy of its shard and adds them in member order, then sends
// its shard to all (see Communicator::StartReduceScatterSum).
//
// Gloo specifics callers may notice: a send completes only once the receiver
// has posted its Recv; on a timeout Gloo itself closes every connection of the
// mesh (hence deadlines are final); and when a peer dies while a transfer's
// payload is partly through the socket, Gloo does not wake that one transfer,
// so its wait ends at its deadline (or at an Abort caused by any other
// failure) rather than at once.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/comm.h"
#include "src/rpc/defaults.h"

namespace dynapipe::runtime::comm {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Prefixes every store key; unique per job attempt, so that attempts
  // sharing a store do not read each other's stale addresses.
  std::string job_prefix;
  // Local address to listen on and advertise to peers.
  std::string interface_address{rpc::kLoopbackHost};
  // Bounds connecting the world mesh and each group's mesh (all ranks must
  // arrive within it).
  absl::Duration connect_timeout = kDefaultConnectTimeout;
  // Scheduling of Gloo's event-loop thread, which moves every transfer's
  // bytes. The loop polls again at once while a rank thread holds a
  // connection's lock, so where ranks outnumber cores it takes the core from
  // the very thread it waits for. SCHED_IDLE (event_loop_idle) gives it the
  // kernel's lowest weight and never lets it preempt another thread: a
  // waking rank thread takes its core at once. It still runs when every
  // core is busy, only rarely. Measured with benchmarks/comm_bench (4 ranks
  // on 2 cores, 256 KiB, medians of 9 rounds, 2026-11-27): 568 us per
  // transfer at nice 0, 233 us at nice 19, 108 us under SCHED_IDLE. Where
  // the kernel refuses SCHED_IDLE the loop runs at event_loop_nice instead.
  bool event_loop_idle = true;
  // Nice value (0-19) of the loop when event_loop_idle is false (or
  // refused); 0 keeps the caller's priority.
  int event_loop_nice = 19;
};

// Connects rank `options.rank` to all others; blocks until every rank has
// called this or connect_timeout passes (DEADLINE_EXCEEDED naming the missing
// store key). `store` must outlive the communicator (groups rendezvous lazily).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     KeyValueStore* store);

}  // namespace dynapipe::runtime::comm
