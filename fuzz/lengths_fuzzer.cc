// Fuzzes the sample-lengths file ("input_len [target_len]" per line): the
// input is written to a file and read with ReadLengths(path, indexed=false),
// as a planner reads a job's `format: lengths` dataset; the lengths then go
// through what BuildJobRuntime does with them (truncation to max_seq_len for
// decoder-only and encoder-decoder models, global batches).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/scratch_dir.h"
#include "planner/partition/global_batches.h"
#include "src/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe;
  static const std::string path = fuzz::ScratchDir() + "/lengths.txt";
  fuzz::WriteScratchFile(path, absl::string_view(reinterpret_cast<const char*>(data), size));
  const auto raw = data::ReadLengths(path, /*indexed=*/false);
  if (!raw.ok()) return 0;
  for (const bool encoder_decoder : {false, true}) {
    std::vector<planner::Sample> samples;
    samples.reserve(raw->size());
    for (size_t i = 0; i < raw->size(); ++i) {
      samples.push_back(planner::Truncate(static_cast<int64_t>(i), (*raw)[i], /*max_seq=*/2048, encoder_decoder));
    }
    (void)planner::FormGlobalBatches(samples, /*budget_tokens=*/65536, encoder_decoder);
  }
  return 0;
}
