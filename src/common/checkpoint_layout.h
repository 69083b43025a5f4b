#pragma once

// Where checkpoint shards live on disk, shared by the executor (which writes
// them, src/checkpoint) and the planner (which finds the newest complete
// checkpoint when Redis has no record of it):
//   {dir}/iter-{iteration:08d}/rank-{rank:05d}.ckpt

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynapipe::checkpoint_layout {

// Host memory a checkpoint's in-memory copy takes per parameter while its
// shard is written: the parameters and both Adam moments, fp32. The
// executor's checkpointer makes the copy; the planner's memory model counts it
// on CPU devices, where it shares the rank's memory.
inline constexpr int kCopyBytesPerParam = 3 * sizeof(float);

// {dir}/iter-{iteration:08d}/rank-{rank:05d}.ckpt
std::string ShardPath(absl::string_view dir, int64_t iteration, int rank);

// The highest iteration whose directory holds the shard files of all ranks
// 0..world-1 (temporary files do not count); -1 if none or `dir` is missing.
// Looks at names only: reading a shard may still find it corrupt.
absl::StatusOr<int64_t> LatestCompleteOnDisk(absl::string_view dir, int world);

// Every shard file's (iteration, rank), by name: iteration -> ranks. Empty
// if `dir` is missing.
using ShardMap = std::map<int64_t, std::set<int>>;
absl::StatusOr<ShardMap> ShardsOnDisk(absl::string_view dir);

// LatestCompleteOnDisk over a listing already made (world >= 1).
int64_t LatestComplete(const ShardMap& shards, int world);

}  // namespace dynapipe::checkpoint_layout
