#include "src/data/synth.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"

namespace dynapipe::data {

const char* SynthTaskName(int task) {
  static const char* kNames[kNumSynthTasks] = {"copy_prefix", "reverse_suffix", "sort_prefix", "sum_mod"};
  return task >= 0 && task < kNumSynthTasks ? kNames[task] : "?";
}

proto::DatasetInfo SynthInfo(const SynthOptions& o) {
  proto::DatasetInfo info;
  info.set_vocab(kFirstTask + kNumSynthTasks + o.alphabet);
  for (int t = 0; t < kNumSynthTasks; ++t) info.add_tasks(SynthTaskName(t));
  info.set_pad_id(kPad);
  info.set_sep_id(kSep);
  info.set_eos_id(kEos);
  info.set_source(absl::StrCat("synth seed ", o.seed, " alphabet ", o.alphabet));
  return info;
}

std::vector<uint32_t> SynthTarget(int task, std::span<const uint32_t> input, const SynthOptions& o) {
  const auto body = input.subspan(1, input.size() - 2);  // between the task token and the separator
  const auto mark = std::find(body.begin(), body.end(), kMark);
  const uint32_t first_symbol = kFirstTask + kNumSynthTasks;
  std::vector<uint32_t> out;
  switch (task) {
    case 0: out.assign(body.begin(), mark); break;
    case 1:
      out.assign(mark == body.end() ? mark : mark + 1, body.end());
      std::reverse(out.begin(), out.end());
      break;
    case 2:
      out.assign(body.begin(), mark);
      std::sort(out.begin(), out.end());
      break;
    default: {
      uint64_t sum = 0;
      for (uint32_t s : body) sum += s == kMark ? 0 : s - first_symbol;
      out.push_back(first_symbol + static_cast<uint32_t>(sum % o.alphabet));
    }
  }
  out.push_back(kEos);
  return out;
}

absl::Status Synthesize(std::span<const data::RawLength> lengths, const SynthOptions& o, DatasetWriter* out) {
  if (o.alphabet < 2) return absl::InvalidArgumentError("alphabet: must be at least 2");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<uint32_t> symbol(0, o.alphabet - 1);
  const uint32_t first_symbol = kFirstTask + kNumSynthTasks;
  std::vector<uint32_t> input;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int task = static_cast<int>(rng() % kNumSynthTasks);
    // Input: the task token, n - 3 symbols (at least one), the mark among
    // them, the separator. t symbols sit before the mark (copy, sort) or
    // after it (reverse); the sum uses every symbol.
    const int n = static_cast<int>(std::clamp<int64_t>(lengths[i].input, 4, std::max(4, o.max_input)));
    const int symbols = n - 3;
    const int t = static_cast<int>(std::clamp<int64_t>(lengths[i].target, 1, std::min(o.max_target, symbols)));
    const int mark_at = task == 1 ? symbols - t : task == 3 ? static_cast<int>(rng() % (symbols + 1)) : t;
    input.assign(1, kFirstTask + task);
    for (int k = 0; k < symbols; ++k) {
      if (k == mark_at) input.push_back(kMark);
      input.push_back(first_symbol + symbol(rng));
    }
    if (mark_at == symbols) input.push_back(kMark);
    input.push_back(kSep);
    RETURN_IF_ERROR(out->Add(input, SynthTarget(task, input, o), static_cast<uint32_t>(task)));
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::data
