#pragma once

// Checkpoint shards for `dynapipe eval`: a tiny GPT job (pp 1, so one shard
// holds the whole model), a dataset for it, a valid shard written with
// checkpoint::WriteShard, and corrupted copies of it, each in a
// checkpoint directory of its own.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::testing::hostile {

inline constexpr int64_t kEvalIteration = 5;  // the iteration every shard claims

struct ShardCase {
  std::string name;
  std::string dir;  // --checkpoint
};

struct CheckpointCorpus {
  std::string job;        // --job: the tiny model's JobSpec (.pbtxt)
  std::string data;       // --data: its dataset
  std::string valid_dir;  // a checkpoint dir holding a valid shard of kEvalIteration
  std::vector<ShardCase> bad;
  std::string bad_vocab_data;  // a dataset whose token ids exceed the model's vocabulary
};

// Everything under `dir`.
absl::StatusOr<CheckpointCorpus> MakeCheckpointCorpus(const std::string& dir);

}  // namespace dynapipe::testing::hostile
