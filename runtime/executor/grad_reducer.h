#pragma once

// Data-parallel gradient reduction that overlaps backward. Each model chunk's
// flat gradient is cut into buckets along what its last backward of an
// iteration completes in turn (Stage::GradsReady): the final LayerNorm and
// head (and a tied token embedding on the last stage), each layer from the
// last to the first, the embeddings. A bucket is started (an all-reduce, or under ZeRO-1 a
// reduce-scatter) as soon as all of it is final, while backward goes on;
// the AllReduceGrads instruction then waits for them all.
//
// Members must start a group's collectives in the same order, and the order
// in which chunks finish backward is the plan's, so buckets start in one
// canonical order: chunks from the last to the first, each chunk's buckets
// in backward order; a bucket completed out of turn waits for its
// predecessors.

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/comm/comm.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::executor {

// A run [offset, offset + size) of a chunk's flat gradient (and parameters).
using GradBucket = model::ParamRun;

// The buckets of a stage laid out as `layout`, in the order its backward
// completes them: consecutive units merged while a bucket holds fewer than
// `min_size` elements. A token embedding stays a bucket of its own, so the
// first and the last stage cut a tied embedding's copies alike.
std::vector<GradBucket> MakeBuckets(const model::GptLayout& layout, size_t min_size);

// Member `index`'s even shard of `run` among `members` (comm::ShardBegin).
GradBucket ShardOf(const GradBucket& run, int members, int index);

// ZeRO-1 ownership, whatever the buckets: a stage's parameters fall in
// regions, a token embedding (so that the first and the last stage cut a
// tied embedding's copies alike and sum them shard by shard) and the rest;
// member k owns its even shard of each region.
// An encoder-decoder's: each tensor several stages hold
// (model::kEncoderDecoderShared) a region of its own, and the runs between.
std::vector<GradBucket> OwnershipRegions(const model::GptLayout& layout);
// Member `index`'s runs, in layout order.
std::vector<model::ParamRun> OwnedRuns(const std::vector<GradBucket>& regions, int members, int index);
// How many elements of `bucket` (inside one region) each member owns, in
// member order: consecutive shards (comm's reduce-scatter counts).
std::vector<size_t> ShardCounts(const GradBucket& bucket, const std::vector<GradBucket>& regions, int members);

// One iteration's reduction over one data-parallel group. Not thread-safe:
// the worker's thread drives it.
class GradReducer {
 public:
  enum class Mode { kAllReduce, kReduceScatter };

  // `grads[c]` is chunk c's gradient, `buckets[c]` its buckets and
  // `regions[c]` its ownership regions (kReduceScatter only; all outlive the
  // reducer); `group` lists the data-parallel peers, this rank included.
  // Each collective's transfers get `timeout` from its start.
  GradReducer(comm::Communicator* comm, std::vector<int> group, Mode mode, std::vector<float*> grads,
              const std::vector<std::vector<GradBucket>>* buckets,
              const std::vector<std::vector<GradBucket>>* regions, absl::Duration timeout);
  // Aborts the communicator if buckets are still in flight (their memory
  // must not be written under them), as comm::Request does.
  ~GradReducer();

  // Chunk `chunk`'s gradient [offset, offset + size) is final: starts every
  // bucket now complete whose turn has come.
  absl::Status Ready(int chunk, size_t offset, size_t size);
  // Starts the buckets left (whatever was reported), then waits for all.
  absl::Status Finish();

  // Buckets started from Ready, that is before Finish (while backward ran).
  int started_early() const { return started_early_; }

 private:
  struct Slot {
    int chunk = 0;
    int index = 0;  // within the chunk's buckets
    GradBucket bucket;
    size_t pending = 0;  // elements not yet reported final
    std::unique_ptr<comm::Request> request;
  };
  absl::Status StartNext();

  comm::Communicator* comm_;
  std::vector<int> group_;
  Mode mode_;
  std::vector<float*> grads_;
  const std::vector<std::vector<GradBucket>>* regions_;
  absl::Duration timeout_;
  std::vector<Slot> slots_;  // canonical order
  size_t next_ = 0;          // first slot not started
  int started_early_ = 0;
  bool finishing_ = false;
};

}  // namespace dynapipe::runtime::executor
