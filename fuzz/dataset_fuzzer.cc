// Fuzzes the dataset reader: each input is split into a dataset directory's
// dataset.pbtxt, index.bin and tokens.bin (fuzz/dataset_input.h) and opened
// with Dataset::Open. A dataset that opens has its Lengths() listed (what
// ReadLengths(dir, indexed=true) gives the planner) and every sample's tokens
// read through sample(), as executors do (AddressSanitizer sees any view past
// tokens.bin).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/dataset_input.h"
#include "fuzz/scratch_dir.h"
#include "src/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe;
  static const std::string dir = fuzz::ScratchDir();
  const fuzz::DatasetFiles files =
      fuzz::SplitDatasetInput(absl::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::WriteScratchFile(dir + "/dataset.pbtxt", files.info);
  fuzz::WriteScratchFile(dir + "/index.bin", files.index);
  fuzz::WriteScratchFile(dir + "/tokens.bin", files.tokens);

  auto dataset = data::Dataset::Open(dir);
  if (!dataset.ok()) return 0;
  const data::Dataset& d = **dataset;
  (void)d.Lengths();
  uint64_t sum = 0;
  for (uint64_t i = 0; i < d.size(); ++i) {
    const data::SampleView s = d.sample(i);
    for (uint32_t t : s.input) sum += t;
    for (uint32_t t : s.target) sum += t;
  }
  // Keeps the reads from being optimised away.
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
