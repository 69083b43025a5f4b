#pragma once

// How dataset_fuzzer's input (and its seeds) holds a dataset directory's
// three files:
//   u32 LE n1 | u32 LE n2 | dataset.pbtxt (n1 bytes) | index.bin (n2 bytes) | tokens.bin (the rest)
// Sizes past the end are clamped, so every input names some directory.

#include <string>

#include "absl/strings/string_view.h"

namespace dynapipe::fuzz {

struct DatasetFiles {
  std::string info;    // dataset.pbtxt
  std::string index;   // index.bin
  std::string tokens;  // tokens.bin
};

// The files an input holds.
DatasetFiles SplitDatasetInput(absl::string_view input);

// The input holding `files` (SplitDatasetInput's inverse).
std::string JoinDatasetInput(const DatasetFiles& files);

}  // namespace dynapipe::fuzz
