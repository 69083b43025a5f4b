#pragma once

// model.init_from: a job starts from pretrained weights in Hugging Face's
// format (GPT2LMHeadModel, T5ForConditionalGeneration, LlamaForCausalLM; a
// .safetensors file or a folder with its config.json, sharded or not)
// instead of the seed's.
// Each stage reads only its own tensors (runtime/model/hf_checkpoint.h), so
// every rank of a pipeline starts from the same model; AdamW starts afresh.

#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::executor {

// Loads `path` (already confined to the data root) into `chunks`. One-line
// INVALID_ARGUMENT / NOT_FOUND prefixed "model.init_from: ": an unreadable
// or malformed file, a config.json of another model type or head count (or,
// for Llama, key-value heads, rope_theta or rms_norm_eps), the
// first tensor missing from the file or of another shape than the job's
// model needs, or a block Hugging Face's class cannot hold.
absl::Status InitFromHuggingFace(const std::string& path, std::span<const std::unique_ptr<model::Stage>> chunks);

}  // namespace dynapipe::runtime::executor
