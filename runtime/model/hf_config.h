#pragma once

// A model's `config.json` for Hugging Face's `transformers`, both ways:
// GPT2LMHeadModel for GPT-kind models with GPT-2's block,
// T5ForConditionalGeneration for T5 (v1.0's ReLU block or v1.1's gated
// GELU), LlamaForCausalLM for Llama's block (RMS norm, SwiGLU, no biases,
// rotary positions, grouped-query attention). The tensors themselves are
// hf_checkpoint.h's.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::model {

// The Hugging Face class a model maps to, by its kind alone: an
// encoder-decoder is T5, a decoder with rotary positions Llama, any other
// decoder GPT-2 (whether its block fits is checked where it is written).
enum class HfFamily { kGpt2, kT5, kLlama };
HfFamily FamilyOf(const GptConfig& config);
// "GPT2LMHeadModel", "T5ForConditionalGeneration" or "LlamaForCausalLM".
const char* HfArchitecture(const GptConfig& config);

// `config.json` for `transformers`, as JSON text; INVALID_ARGUMENT for a
// block the family's class cannot hold.
absl::StatusOr<std::string> HfConfigJson(const GptConfig& config);

// The reverse: the model a Hugging Face `config.json` describes (model_type
// gpt2, t5 or llama, with transformers' defaults for absent fields).
// INVALID_ARGUMENT naming the field for what our blocks cannot run (another
// model type or activation, d_kv or head_dim other than hidden / heads,
// Llama's rope_scaling or biases, key-value heads not dividing the heads).
absl::StatusOr<GptConfig> ConfigFromHfJson(absl::string_view json);

// A config.json found beside weights a job starts from, against the job's
// model: one-line INVALID_ARGUMENT naming the field where it describes
// another model in what no tensor's shape shows (model type, heads; for
// Llama the key-value heads, rope_theta, rms_norm_eps) or asks for what our
// blocks cannot run. Fields it leaves out are not checked; "" passes.
absl::Status CheckHfConfig(absl::string_view json, const GptConfig& job);

}  // namespace dynapipe::runtime::model
