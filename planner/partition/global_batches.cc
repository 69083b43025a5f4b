#include "planner/partition/global_batches.h"

#include <algorithm>

namespace dynapipe::planner {

Sample Truncate(int64_t id, const data::RawLength& raw, int max_seq, bool encoder_decoder) {
  Sample s;
  s.id = id;
  if (encoder_decoder) {
    s.input = static_cast<int32_t>(std::min<int64_t>(raw.input, max_seq));
    s.target = static_cast<int32_t>(std::min<int64_t>(raw.target, max_seq));
  } else {
    // Each side capped before the sum: lengths files allow any int64, and
    // input + target must not overflow (min(a, m) + min(b, m) capped at m is
    // min(a + b, m) for the non-negative lengths every reader returns).
    const int64_t sum = std::min<int64_t>(raw.input, max_seq) + std::min<int64_t>(raw.target, max_seq);
    s.input = static_cast<int32_t>(std::min<int64_t>(sum, max_seq));
    s.target = static_cast<int32_t>(std::min<int64_t>(raw.target, s.input));
  }
  return s;
}

std::vector<std::vector<Sample>> FormGlobalBatches(std::span<const Sample> samples, int64_t budget_tokens,
                                                   bool encoder_decoder) {
  std::vector<std::vector<Sample>> out;
  std::vector<Sample> cur;
  int64_t tokens = 0;
  for (const Sample& s : samples) {
    const int64_t t = SampleTokens(s, encoder_decoder);
    if (!cur.empty() && tokens + t > budget_tokens) {
      out.push_back(std::move(cur));
      cur.clear();
      tokens = 0;
    }
    cur.push_back(s);
    tokens += t;
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace dynapipe::planner
