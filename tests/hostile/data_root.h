#pragma once

// The scratch directory a planner under test serves as --data_root, filled
// with the files hostile jobs name: a valid lengths file and dataset, broken
// lengths files (checked in under corpus/lengths/ plus generated ones),
// datasets written by DatasetWriter and then corrupted, FIFOs, directories,
// symbolic links out of the root, sparse files over the read limit.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::testing::hostile {

// A file or directory a job can name, and what it is.
struct FileCase {
  std::string name;  // for the table
  std::string path;  // as a job names it: relative to the root, or absolute
};

// Bits of PathCase::fields: which job fields a path is garbage for.
inline constexpr unsigned kLengthsPath = 1;      // dataset.path, format lengths
inline constexpr unsigned kIndexedPath = 2;      // dataset.path, format indexed
inline constexpr unsigned kCheckpointDir = 4;    // checkpoint.dir
inline constexpr unsigned kCostProfilePath = 8;  // cost_profile_path
inline constexpr unsigned kAllPathFields = 15;

struct PathCase {
  std::string name;
  std::string path;
  unsigned fields;  // where it is garbage (elsewhere it may name something legal)
};

struct DataRoot {
  std::string root;     // the planner's --data_root
  std::string outside;  // a directory beside it (secret.txt, a valid dataset)
  std::string lengths = "lengths.txt";  // valid
  // Valid: 20,000 samples of 2-3 tokens (global batches of many samples).
  std::string many_short = "many-short.txt";
  std::string dataset = "ds";           // valid indexed dataset, vocab 16
  std::vector<FileCase> bad_lengths;
  std::vector<FileCase> good_lengths;  // edge cases that are legal
  std::vector<FileCase> bad_datasets;
  // Garbage only for a planner: outside its root, or over the job's vocabulary.
  std::vector<FileCase> bad_datasets_planner_only;
  // Garbage only for `dynapipe data info`, which reads every token (a planner
  // reads the lengths; training checks ids against the model's vocabulary).
  std::vector<FileCase> bad_datasets_cli_only;
  std::vector<PathCase> bad_paths;
};

// Creates `dir`/root and `dir`/outside. `lengths_corpus`: the checked-in
// directory of broken lengths files.
absl::StatusOr<DataRoot> MakeDataRoot(const std::string& dir, const std::string& lengths_corpus);

// Paths that are garbage for a planner serving --data_root=/ (the most
// permissive root): devices, FIFOs, /proc files; `fifo` is an absolute FIFO.
std::vector<PathCase> PermissiveRootPaths(const std::string& fifo);

// Writes `n` seeded random bytes (deterministic for a seed).
std::string RandomBytes(size_t n, uint32_t seed);

}  // namespace dynapipe::testing::hostile
