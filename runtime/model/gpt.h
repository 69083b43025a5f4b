#pragma once

// A GPT decoder (pre-LayerNorm, GELU MLP, learned positions, optionally tied
// LM head) cut into pipeline stages. A stage owns a contiguous layer range;
// the first stage also embeds, the last stage also applies the final
// LayerNorm, the LM head and the loss. With a tied head and more than one
// stage, first and last stage each hold a copy of `wte`; their gradients are
// summed across the two before the optimizer step (TiedEmbeddingGrad), so the
// copies stay identical.
//
// Parameters are initialised from the seed and each tensor's name alone, so
// a model has the same weights however it is split into stages.
//
// Forward stashes the activations backward needs, per micro-batch, in pool
// buffers; Backward releases them. Several micro-batches may be in flight
// (pipeline schedules run forwards ahead of backwards).

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/model.pb.h"
#include "runtime/backend/cpu/ops.h"
#include "runtime/memory/buffer_pool.h"

namespace dynapipe::runtime::model {

struct GptConfig {
  int num_layers = 0;
  int hidden = 0;
  int heads = 0;
  int ffn = 0;
  int vocab = 0;
  int max_positions = 0;
  bool tie_embeddings = true;
  cpu::AttentionKernel attention = cpu::AttentionKernel::kVarlen;

  // INVALID_ARGUMENT naming the field for a spec this model cannot run.
  static absl::StatusOr<GptConfig> FromSpec(const proto::ModelSpec& spec);
};

// One micro-batch as the model sees it: rows x seq token grids, row-major.
struct TokenBatch {
  int64_t rows = 0;
  int64_t seq = 0;
  std::vector<int32_t> tokens;     // pad where no sample
  std::vector<int32_t> positions;  // within each sample
  std::vector<int32_t> segments;   // sample within the row; -1: padding
  std::vector<int32_t> targets;    // next token where scored, else -1
  int64_t real_tokens = 0;         // segments >= 0
  int64_t loss_tokens = 0;         // targets >= 0
};

// INVALID_ARGUMENT when the batch's tensors do not match its shape, or a
// token id or position lies outside the model (the embedding kernels of both
// backends trust them).
absl::Status CheckTokenBatch(const TokenBatch& batch, const GptConfig& config);

struct ParamInfo {
  std::string name;  // e.g. "wte", "h.3.attn.qkv.w", "lnf.b"
  std::vector<int64_t> shape;
  size_t offset = 0;  // in the stage's flat parameter (and gradient) array
  size_t size = 0;
};

class GptStage {
 public:
  struct Options {
    int first_layer = 0;
    int num_layers = 0;
    bool first = true;  // embeds
    bool last = true;   // final LayerNorm, head, loss
    uint64_t seed = 1;
  };
  static absl::StatusOr<std::unique_ptr<GptStage>> Create(const GptConfig& config, const Options& options,
                                                          BufferPool* pool);
  ~GptStage();
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;

  const GptConfig& config() const { return config_; }
  const Options& options() const { return options_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo* FindParam(const std::string& name) const;
  std::span<float> param_data() { return params_data_; }
  std::span<float> grad_data() { return grads_data_; }
  std::span<const float> param_data() const { return params_data_; }
  std::span<const float> grad_data() const { return grads_data_; }
  void ZeroGrads();
  // Whether this stage holds a copy of the tied embedding that another stage
  // also holds (tied head, first != last).
  bool HasSharedEmbedding() const;

  // Elements of the hidden-state tensor crossing a stage boundary.
  int64_t HiddenElements(const TokenBatch& batch) const { return batch.rows * batch.seq * config_.hidden; }

  // Forward of micro-batch `mb`. The first stage reads batch.tokens and
  // positions, later stages `hidden_in` (rows, seq, hidden). Stages other
  // than the last write `hidden_out`. The last stage returns the loss summed
  // over scored tokens, each weighted by `loss_scale` (1 / loss tokens of the
  // global batch); other stages return 0.
  absl::StatusOr<double> Forward(int mb, const TokenBatch& batch, const float* hidden_in, float* hidden_out,
                                 float loss_scale);
  // Backward of micro-batch `mb`, accumulating parameter gradients.
  // `dhidden_out`: gradient of this stage's output (null on the last stage).
  // `dhidden_in`: receives the gradient of the stage input (not written on
  // the first stage; may be null there).
  absl::Status Backward(int mb, const float* dhidden_out, float* dhidden_in);
  // Forward without keeping anything for backward (evaluation): like
  // Forward, except that the last stage writes the logits of every position,
  // (rows * seq, vocab), to `out`; other stages write the hidden state.
  absl::Status Infer(const TokenBatch& batch, const float* hidden_in, float* out);
  // Micro-batches forwarded but not yet backwarded.
  size_t in_flight() const { return stash_.size(); }

 private:
  struct Stash;
  struct Layer {  // parameter offsets
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
  };
  GptStage(const GptConfig& c, const Options& o, BufferPool* pool);
  void Build();
  float* P(size_t offset) { return params_data_.data() + offset; }
  float* G(size_t offset) { return grads_data_.data() + offset; }
  size_t Add(const std::string& name, std::vector<int64_t> shape);

  GptConfig config_;
  Options options_;
  BufferPool* pool_;
  std::vector<ParamInfo> params_;
  std::vector<float> params_data_;
  std::vector<float> grads_data_;
  std::vector<Layer> layers_;
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_ = 0;
  std::map<int, std::unique_ptr<Stash>> stash_;
};

// Deterministic N(0, std) value number `index` of the tensor `name`.
float InitNormal(uint64_t seed, const std::string& name, uint64_t index, float std);

}  // namespace dynapipe::runtime::model
