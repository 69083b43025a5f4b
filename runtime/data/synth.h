#pragma once

// A learnable multi-task dataset whose lengths follow a given length list
// (e.g. the FLAN-like file): sample i takes its input and target lengths from
// entry i. Tasks, each marked by a task token at the start of the input (the
// input ends with a separator):
//   copy_prefix    target = the first t symbols of the input
//   reverse_suffix target = the last t symbols, reversed
//   sort_prefix    target = the first t symbols, sorted
//   sum_mod        target = one symbol: the sum of all symbols mod the alphabet
// followed by EOS. Symbols are drawn uniformly from a small alphabet.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "planner/partition/global_batches.h"
#include "runtime/data/dataset.h"

namespace dynapipe::runtime::data {

struct SynthOptions {
  uint64_t seed = 1;
  int alphabet = 32;     // symbol tokens
  int max_input = 2048;  // longer inputs are shortened
  int max_target = 256;
};

// Token ids: 0 pad, 1 sep, 2 eos, 3.. task tokens, then the alphabet. Every
// input is [task, symbols..., sep]: the separator tells the model where the
// answer starts.
inline constexpr uint32_t kPad = 0, kSep = 1, kEos = 2, kFirstTask = 3;
inline constexpr int kNumSynthTasks = 4;
const char* SynthTaskName(int task);

// The DatasetInfo a synthetic dataset gets (vocab, task names, special ids).
proto::DatasetInfo SynthInfo(const SynthOptions& options);

// Writes one sample per entry of `lengths`.
absl::Status Synthesize(std::span<const planner::RawLength> lengths, const SynthOptions& options, DatasetWriter* out);

// The target the task defines for `input` (task token first, separator last), with EOS.
std::vector<uint32_t> SynthTarget(int task, std::span<const uint32_t> input, int target_len, const SynthOptions& options);

}  // namespace dynapipe::runtime::data
