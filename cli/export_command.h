#pragma once

// `dynapipe export JOB --out DIR`: a job's trained model in Hugging Face's
// format (model.safetensors, sharded past a size, and config.json) from its
// checkpoint shards, without the job running (runtime/model/hf_checkpoint.h).

#include <ostream>
#include <string>
#include <vector>

namespace dynapipe::cli {

// Shards past this many megabytes go to model-0000i-of-0000n.safetensors
// with a model.safetensors.index.json (transformers' own default).
inline constexpr int64_t kExportDefaultMaxShardMb = 5000;

int RunExportCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace dynapipe::cli
