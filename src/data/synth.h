#pragma once

// A learnable multi-task dataset whose lengths follow a given length list
// (e.g. the FLAN-like file): sample i takes its input and target lengths from
// entry i. Every input is [task, symbols with one MARK among them, SEP]; the
// mark delimits the part a task works on, so every target is a function of
// the input (the model can always know what comes next, including EOS):
//   copy_prefix    target = the symbols before the mark
//   reverse_suffix target = the symbols after the mark, reversed
//   sort_prefix    target = the symbols before the mark, sorted
//   sum_mod        target = one symbol: the sum of all symbols mod the alphabet
// followed by EOS; t (the target length) places the mark. Symbols are drawn
// uniformly from a small alphabet.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "src/data/lengths.h"
#include "src/data/dataset.h"

namespace dynapipe::data {

struct SynthOptions {
  uint64_t seed = 1;
  int alphabet = 32;     // symbol tokens
  int max_input = 2048;  // longer inputs are shortened
  int max_target = 256;
};

// Token ids: 0 pad, 1 sep (ends every input: the answer follows), 2 eos,
// 3 mark, 4.. task tokens, then the alphabet.
inline constexpr uint32_t kPad = 0, kSep = 1, kEos = 2, kMark = 3, kFirstTask = 4;
inline constexpr int kNumSynthTasks = 4;
const char* SynthTaskName(int task);

// The DatasetInfo a synthetic dataset gets (vocab, task names, special ids).
proto::DatasetInfo SynthInfo(const SynthOptions& options);

// Writes one sample per entry of `lengths`.
absl::Status Synthesize(std::span<const data::RawLength> lengths, const SynthOptions& options, DatasetWriter* out);

// The target the task defines for `input` (task token first, separator last), with EOS.
std::vector<uint32_t> SynthTarget(int task, std::span<const uint32_t> input, const SynthOptions& options);

}  // namespace dynapipe::data
