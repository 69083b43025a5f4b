#pragma once

// A whole model's parameters in Hugging Face's names and layouts, both ways:
// GPT-2 (`GPT2LMHeadModel`) for GPT-kind models with GPT-2's block, T5 /
// FLAN-T5 (`T5ForConditionalGeneration`) for T5-kind models (T5 v1.0's
// ReLU block or v1.1's gated GELU), and Llama (`LlamaForCausalLM`) for
// decoders with Llama's block; their `config.json` is hf_config.h's.
//
// The layouts differ only by slicing and transposition: GPT-2's Conv1D
// weights are stored (in, out), the transpose of our (out, in); T5 and
// Llama keep separate q, k and v (our fused [q; k; v] rows; Llama's k and v
// have kv_heads heads each) and separate gate and up halves of a gated MLP;
// T5's relative bias tables live in each stack's first block. Llama's
// rotary positions follow Hugging Face's rotate-half pairs, so its q_proj
// and k_proj rows are ours as they are. Values are copied exactly
// (float32), so export then import gives the same bits.

#include <cstdint>
#include <functional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/hf_config.h"  // config.json both ways, for callers of either
#include "runtime/model/layout.h"
#include "src/safetensors/weight_set.h"

namespace dynapipe::runtime::model {

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Where one Hugging Face tensor's values come from: rows [row0, row0 + rows)
// of our tensor `ours` seen as a matrix of its first dimension by the rest,
// transposed for GPT-2's Conv1D weights.
struct HfPiece {
  std::string hf;
  std::string ours;
  int64_t row0 = 0, rows = 0, cols = 1;
  bool transpose = false;
  std::vector<int64_t> hf_shape;
};

// Every piece of `whole` (a layout holding all layers: StageOptions{0,
// TotalLayers(), true, true}), each of its parameters covered exactly once.
// INVALID_ARGUMENT for a model Hugging Face's class cannot express (a GPT
// block other than GPT-2's, a T5 block with biases or LayerNorm, a rotary
// decoder without Llama's block), naming why.
absl::StatusOr<std::vector<HfPiece>> HfPieces(const GptLayout& whole);

// The Hugging Face tensors of a whole model's parameters (layout order).
absl::StatusOr<std::vector<HfTensor>> ToHuggingFace(const GptLayout& whole, std::span<const float> params);

// The reverse, into `params` in the layout order of `dest` (a whole model,
// or one pipeline stage: then only its own tensors are read). Every piece of
// the model is checked against the source (one line naming the first
// missing tensor or mismatching dimension). GPT-2 and Llama names are
// taken with or without their base model's prefix ("transformer.",
// "model.").
struct HfSource {
  // Shape of `name`, or NOT_FOUND.
  std::function<absl::StatusOr<std::vector<int64_t>>(const std::string& name)> shape;
  // Its values widened to float32.
  std::function<absl::StatusOr<std::vector<float>>(const std::string& name)> values;
};
absl::Status FromHuggingFace(const GptLayout& dest, const HfSource& source, std::span<float> params);

// A source over an opened file or folder of weights, which must outlive it.
HfSource WeightsSource(const safetensors::WeightSet& weights);

// Writes a whole model's Hugging Face tensors to `dir` (which must exist):
// model.safetensors, or model-0000i-of-0000n.safetensors runs of at most
// `max_shard_bytes` with model.safetensors.index.json; then config.json.
// Each file atomically; a line per shard to `progress` (may be null).
absl::Status WriteHfModel(const std::vector<HfTensor>& tensors, const std::string& config_json, const std::string& dir,
                          uint64_t max_shard_bytes, std::ostream* progress);

}  // namespace dynapipe::runtime::model
