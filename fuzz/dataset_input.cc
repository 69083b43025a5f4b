#include "fuzz/dataset_input.h"

#include <algorithm>
#include <cstdint>

namespace dynapipe::fuzz {
namespace {

// Takes a u32 LE size from the front of `in` (0 when fewer than 4 bytes remain).
size_t TakeSize(absl::string_view* in) {
  if (in->size() < 4) {
    in->remove_prefix(in->size());
    return 0;
  }
  const auto* b = reinterpret_cast<const unsigned char*>(in->data());
  const uint32_t n = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
  in->remove_prefix(4);
  return n;
}

std::string Take(absl::string_view* in, size_t n) {
  n = std::min(n, in->size());
  std::string out(in->substr(0, n));
  in->remove_prefix(n);
  return out;
}

void PutSize(std::string* out, size_t n) {
  const uint32_t v = static_cast<uint32_t>(n);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

DatasetFiles SplitDatasetInput(absl::string_view input) {
  const size_t info_size = TakeSize(&input);
  const size_t index_size = TakeSize(&input);
  DatasetFiles files;
  files.info = Take(&input, info_size);
  files.index = Take(&input, index_size);
  files.tokens = std::string(input);
  return files;
}

std::string JoinDatasetInput(const DatasetFiles& files) {
  std::string out;
  PutSize(&out, files.info.size());
  PutSize(&out, files.index.size());
  out += files.info;
  out += files.index;
  out += files.tokens;
  return out;
}

}  // namespace dynapipe::fuzz
