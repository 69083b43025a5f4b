#pragma once

// Reads a sample-lengths file: one sample per line, "input_len [target_len]",
// '#' starts a comment, blank lines are skipped. Errors name file and line.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/partition/global_batches.h"

namespace dynapipe::cli {

absl::StatusOr<std::vector<planner::RawLength>> ReadLengthsFile(const std::string& path);

// Same, from text already in memory; `source` names it in errors.
absl::StatusOr<std::vector<planner::RawLength>> ParseLengths(const std::string& text, const std::string& source);

}  // namespace dynapipe::cli
