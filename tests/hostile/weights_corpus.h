#pragma once

// Hugging Face weight files a job can name as model.init_from: one valid
// model and the ways a file or folder can lie (headers, offsets, dtypes,
// indexes, FIFOs, devices), written under a planner's data root.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/hostile/data_root.h"

namespace dynapipe::testing::hostile {

struct WeightsCorpus {
  std::string valid;            // relative to the root: a folder with model.safetensors and config.json
  std::vector<FileCase> bad;    // each relative to the root
};

// Writes the corpus under `root`/weights.
absl::StatusOr<WeightsCorpus> MakeWeightsCorpus(const std::string& root);

}  // namespace dynapipe::testing::hostile
