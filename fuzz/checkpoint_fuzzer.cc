// Fuzzes the checkpoint shard reader: each input is written as the shard of
// iteration 3, rank 1 and read back with ReadShard (header, sizes, tensors,
// checksum); a shard that verifies is compared with CheckSameJob as an
// executor does on resume. Seeds are real shards written by WriteShard.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/scratch_dir.h"
#include "src/checkpoint/checkpoint.h"

namespace {
constexpr int64_t kIteration = 3;
constexpr int kRank = 1;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe;
  static const std::string path = [] {
    const std::string p = checkpoint::ShardPath(fuzz::ScratchDir(), kIteration, kRank);
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    return p;
  }();
  fuzz::WriteScratchFile(path, absl::string_view(reinterpret_cast<const char*>(data), size));
  const auto shard = checkpoint::ReadShard(fuzz::ScratchDir(), kIteration, kRank);
  if (!shard.ok()) return 0;
  checkpoint::ShardInfo want;
  want.iteration = kIteration;
  want.rank = kRank;
  want.world = 2;
  want.pp_rank = 1;
  (void)checkpoint::CheckSameJob(want, *shard);
  return 0;
}
