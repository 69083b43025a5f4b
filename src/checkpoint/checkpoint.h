#pragma once

// Per-rank checkpoint shards. Every rank writes its own parameters and AdamW
// moments after an iteration to {dir}/iter-{iteration:08d}/rank-{rank:05d}.ckpt.
// A checkpoint counts only once every rank's shard is written: the planner
// records that in Redis from the ranks' reports (PlanStore::MarkCheckpointShard);
// LatestCompleteOnDisk is the fallback when Redis has no record.
//
// File format (little-endian):
//   "DPCKPT01"                    magic and format version
//   uint32                        header length
//   CheckpointHeader              proto/checkpoint.proto
//   zero bytes                    to an 8-byte boundary
//   float32 arrays                params, then adam_m, then adam_v, in header order
//   uint64                        checksum of every byte before it
// Shards are written atomically (temporary file, fsync, rename, fsync of the
// directory): a crash leaves the old state or the whole new shard, never a torn one.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"
#include "src/common/checkpoint_layout.h"
#include "src/spec/job_spec.h"

namespace dynapipe::checkpoint {

// What a shard is: which job, rank and training step it belongs to.
struct ShardInfo {
  int64_t iteration = -1;  // last completed iteration
  int rank = 0, pp_rank = 0, dp_rank = 0, world = 1;
  int64_t optimizer_step = 0;
  uint64_t job_fingerprint = 0;  // JobFingerprint(spec)
};

// A tensor to write: a view of the caller's buffer (not copied).
struct TensorRef {
  std::string name;
  std::span<const float> data;
};

// A tensor read back: owned.
struct Tensor {
  std::string name;
  std::vector<float> data;
};

// What WriteShard writes. adam_m / adam_v may differ from params in number
// and size (ZeRO-1 ranks hold a slice of the optimizer state).
struct ShardRef : ShardInfo {
  std::vector<TensorRef> params, adam_m, adam_v;
};

// What ReadShard returns.
struct Shard : ShardInfo {
  std::vector<Tensor> params, adam_m, adam_v;
};

// {dir}/iter-{iteration:08d}/rank-{rank:05d}.ckpt (src/common/checkpoint_layout.h)
using checkpoint_layout::ShardPath;

// Writes the shard atomically, creating directories as needed.
// INVALID_ARGUMENT for a negative iteration or a rank outside 0..world-1.
// `cancelled` (may be empty) is asked between pieces of at most 16 MiB: once
// true, the write ends CANCELLED and leaves nothing at the shard's path.
absl::Status WriteShard(absl::string_view dir, const ShardRef& shard, const std::function<bool()>& cancelled = {});

// Reads and verifies a shard: NOT_FOUND if absent; DATA_LOSS (naming the
// file) if not a regular file (a FIFO is refused, not waited on), truncated,
// corrupt, failing the checksum, listing a tensor twice, or holding another
// iteration or rank than its path says.
absl::StatusOr<Shard> ReadShard(absl::string_view dir, int64_t iteration, int rank);
// The shard's header only (which job layout, rank and step it holds): the
// same errors for what it reads; the tensors and checksum are not read.
absl::StatusOr<ShardInfo> ReadShardInfo(absl::string_view dir, int64_t iteration, int rank);

// The newest iteration with every rank's shard file; -1 if none.
using checkpoint_layout::LatestCompleteOnDisk;

// A hash of what decides the shapes and placement of a rank's tensors: the
// model spec after spec::NormalizeJobSpec (except its name), pp, dp,
// layer_to_device and optimizer.zero1 (not grad_bucket_mb: buckets change
// how gradients travel, not what a rank keeps). The same for the same spec in every
// process (deterministic serialization; fields left at 0 do not count, so
// adding a proto field does not change old fingerprints).
uint64_t JobFingerprint(const spec::NormalizedJobSpec& spec);

// FAILED_PRECONDITION, naming the field, unless `got` (read from a shard)
// belongs to the same job layout and rank as `want` (job_fingerprint, world,
// rank, pp_rank, dp_rank).
absl::Status CheckSameJob(const ShardInfo& want, const ShardInfo& got);

}  // namespace dynapipe::checkpoint
