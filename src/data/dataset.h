#pragma once

// The training dataset format: a directory with
//   tokens.bin    "DPDSTOK1" then uint32 little-endian token ids; each sample's
//                 input tokens followed by its target tokens
//   index.bin     "DPDSIDX1", u32 version, u32 reserved, u64 samples, u64 tokens,
//                 then per sample {u64 offset (in tokens), u32 input_len,
//                 u32 target_len, u32 task, u32 reserved}
//   dataset.pbtxt DatasetInfo (vocabulary, task names, special ids, source)
// Readers memory-map both files and touch only the samples a plan names;
// anything inconsistent is DATA_LOSS (dataset.pbtxt's counts, version and
// vocabulary included); a file that is not a regular file (a FIFO, a device,
// a directory) is INVALID_ARGUMENT, never waited on. Writers publish atomically (temporary
// files, fsync, rename; dataset.pbtxt last).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/data/lengths.h"
#include "proto/dataset.pb.h"

namespace dynapipe::data {

inline constexpr uint32_t kFormatVersion = 1;

// The files of a dataset directory.
inline constexpr const char* kDatasetFiles[] = {"dataset.pbtxt", "index.bin", "tokens.bin"};

// OK when each of the dataset's files in `dir` resolves under `data_root`
// (ConfinedPath): a directory inside the root whose files link out is refused.
absl::Status CheckDatasetConfined(const std::string& data_root, const std::string& dir);

struct SampleView {
  std::span<const uint32_t> input;
  std::span<const uint32_t> target;
  uint32_t task = 0;
};

class DatasetWriter {
 public:
  // `info` gives vocab, tasks, special ids and source; counts are filled in.
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(const std::string& dir, proto::DatasetInfo info);
  ~DatasetWriter();
  // INVALID_ARGUMENT for an empty input, an id outside the vocabulary or an unknown task.
  absl::Status Add(std::span<const uint32_t> input, std::span<const uint32_t> target, uint32_t task);
  // Publishes the dataset; the writer is unusable afterwards.
  absl::Status Finish();

 private:
  DatasetWriter() = default;
  struct Files;
  std::unique_ptr<Files> files_;
  std::string dir_;
  proto::DatasetInfo info_;
  uint64_t tokens_ = 0;
  uint64_t samples_ = 0;
};

class Dataset {
 public:
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const std::string& dir);
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  uint64_t size() const { return num_samples_; }
  const proto::DatasetInfo& info() const { return info_; }
  // Sample `i` (< size()); the views stay valid while the Dataset lives.
  SampleView sample(uint64_t i) const;
  // (input, target) lengths of every sample, for the planner.
  std::vector<data::RawLength> Lengths() const;
  // Reads every token: DATA_LOSS naming the first id outside the declared
  // vocabulary (Open checks the structure only; a training batch checks its
  // own tokens against the model's vocabulary).
  absl::Status VerifyTokens() const;

 private:
  Dataset() = default;
  proto::DatasetInfo info_;
  const uint8_t* index_ = nullptr;
  size_t index_bytes_ = 0;
  const uint32_t* tokens_ = nullptr;
  size_t token_bytes_ = 0;
  uint64_t num_samples_ = 0;
};

// Lengths of a dataset given as a JobSpec names it: an indexed dataset
// directory, or a lengths file ("input_len [target_len]" per line).
absl::StatusOr<std::vector<data::RawLength>> ReadLengths(const std::string& path, bool indexed);

}  // namespace dynapipe::data
