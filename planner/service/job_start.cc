#include "planner/service/job_start.h"

#include "absl/strings/str_cat.h"
#include "src/checkpoint/checkpoint.h"
#include "src/common/checkpoint_layout.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

absl::StatusOr<StartPoint> StartOf(const spec::NormalizedJobSpec& normalized, const std::string& data_root,
                                   store::PlanStore& store) {
  const proto::JobSpec& spec = normalized.proto();
  StartPoint start;
  const std::string& dir = spec.checkpoint().dir();
  if (dir.empty()) return start;
  const int world = spec.parallelism().pp() * spec.parallelism().dp();
  ASSIGN_OR_RETURN(const spec::JobPaths paths, spec::ConfineJobPaths(normalized, data_root));
  const std::string& on_disk = paths.checkpoint_dir;
  // Any shard at all: something a run from iteration 0 would overwrite.
  ASSIGN_OR_RETURN(const checkpoint_layout::ShardMap shards, checkpoint_layout::ShardsOnDisk(on_disk));
  if (!spec.checkpoint().resume()) {
    if (shards.empty()) return start;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: ", dir, " already holds checkpoints (iteration ", shards.rbegin()->first,
        "); set checkpoint.resume to continue from them, or choose an empty directory"));
  }
  // Resuming: after the latest checkpoint every rank completed, as the ranks'
  // reports recorded it, else as the shards on disk show it (a new or
  // flushed Redis).
  ASSIGN_OR_RETURN(int64_t latest, store.LatestCheckpoint(dir));
  start.source = "recorded in the store";
  if (latest < 0) {
    latest = checkpoint_layout::LatestComplete(shards, world);
    start.source = "found on disk";
  }
  if (latest < 0 && !shards.empty()) {
    // No complete checkpoint, but shards: debris of this very job (a run that
    // died while writing its first checkpoint) is started over; anything
    // else would be overwritten, so it is refused.
    const uint64_t fingerprint = checkpoint::JobFingerprint(normalized);
    for (const auto& [iteration, ranks] : shards) {
      for (const int rank : ranks) {
        const absl::StatusOr<checkpoint::ShardInfo> info =
            checkpoint::ReadShardInfo(on_disk, iteration, rank);
        if (!info.ok() || info->job_fingerprint != fingerprint || info->world != world) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint.resume: ", dir, " holds shards but no checkpoint with all ", world, " ranks' shards, and ",
              checkpoint_layout::ShardPath(dir, iteration, rank),
              info.ok() ? " belongs to another job layout" : absl::StrCat(" cannot be read (", info.status().message(), ")"),
              "; starting over would overwrite them (remove them or choose another checkpoint.dir)"));
        }
      }
    }
    start.source = "found on disk: only an incomplete checkpoint of this job, started over";
  }
  start.iteration = latest + 1;
  if (start.iteration >= spec.iterations()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.resume: the latest complete checkpoint in ", dir,
                                                   " is iteration ", latest, ", which leaves none of the job's ",
                                                   spec.iterations(), " iterations to run"));
  }
  return start;
}

}  // namespace dynapipe::planner::service
