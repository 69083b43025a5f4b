#pragma once

// Reads a sample-lengths file: one sample per line, "input_len [target_len]",
// '#' starts a comment, blank lines are skipped. Errors name file and line.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::data {

// A sample's lengths as the data holds them, before truncation to a model's
// maximum sequence length.
struct RawLength {
  int64_t input = 0;
  int64_t target = 0;
};

absl::StatusOr<std::vector<RawLength>> ReadLengthsFile(const std::string& path);

// Same, from text already in memory; `source` names it in errors.
absl::StatusOr<std::vector<RawLength>> ParseLengths(const std::string& text, const std::string& source);

}  // namespace dynapipe::data
