#pragma once

// A model's weights as Hugging Face ships them: one .safetensors file, or a
// folder holding model.safetensors, or shards listed by
// model.safetensors.index.json ("weight_map": tensor name -> file), beside
// its config.json. Only headers are read on Open (every file checked as
// Reader does, and the index against the files); tensors are read on demand.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/safetensors/safetensors.h"

namespace dynapipe::safetensors {

class WeightSet {
 public:
  // INVALID_ARGUMENT / NOT_FOUND (one line naming the path) for a missing
  // path, a folder with neither model.safetensors nor an index, an index
  // naming a file outside the folder or a tensor its file lacks, a tensor in
  // two files, or any file Reader refuses.
  static absl::StatusOr<WeightSet> Open(const std::string& path, const Limits& limits = {});

  const TensorInfo* Find(absl::string_view name) const;
  absl::StatusOr<std::vector<float>> ReadF32(absl::string_view name) const;
  // Every tensor, by name.
  size_t size() const { return where_.size(); }
  // The folder's config.json, or "" (a single file, or none there).
  const std::string& config_json() const { return config_json_; }

 private:
  std::vector<std::unique_ptr<Reader>> readers_;
  std::map<std::string, const Reader*, std::less<>> where_;
  std::string config_json_;
};

// The "weight_map" of a model.safetensors.index.json (tensor name -> file
// name), parsed by the same strict JSON reader as headers.
absl::StatusOr<std::map<std::string, std::string>> ParseWeightMap(absl::string_view index_json);

}  // namespace dynapipe::safetensors
