#pragma once

// What every backend's GPT stage shares: the model config, the micro-batch
// tensors, and one parameter layout with its initialisation. A stage owns a
// contiguous layer range; the first stage also embeds, the last stage also
// applies the final LayerNorm, the LM head and the loss. With a tied head
// and more than one stage, first and last stage each hold a copy of `wte`.
//
// The layout is the contract between backends, checkpoints and the
// optimizer: tensor names, shapes and offsets in one flat array (in this
// order, packed with no gaps), and the two parameter groups the optimizer
// treats differently:
//   - weight decay applies to matrices only (embeddings, projections, the
//     head), never to biases or LayerNorm gains;
//   - the global gradient norm counts each parameter of the model once, so
//     the last stage's copy of a tied `wte` does not count (the first
//     stage's does).
// Values are initialised from the seed and each tensor's name alone, so a
// model has the same weights however it is split and whichever backend
// holds it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/model.pb.h"
#include "src/spec/job_spec.h"

namespace dynapipe::runtime::model {

// Which attention kernel a backend runs (model.attention): varlen computes
// only the pairs inside one sample; materialized every causal pair of a row,
// masked afterwards (Megatron-LM's packing). Results are the same.
enum class AttentionKernel { kVarlen, kMaterialized };

// What a forward keeps for backward (the plan's RecomputeLevel): everything;
// everything but the attention internals, recomputed in backward
// (selective); or only each layer's input, the whole layer recomputed in
// backward (full).
enum class Recompute { kNone, kSelective, kFull };

// Element types of the tensors crossing stage boundaries.
enum class DType { kF32, kBF16 };
size_t DTypeBytes(DType dtype);
const char* DTypeName(DType dtype);

// The block's normalisation and feed-forward (model.block).
enum class NormKind { kLayerNorm, kRms };
enum class MlpKind { kGelu, kRelu, kGatedGelu, kSwiglu };

struct GptConfig {
  int num_layers = 0;
  int hidden = 0;
  int heads = 0;
  int ffn = 0;
  int vocab = 0;
  int max_positions = 0;
  bool tie_embeddings = true;
  AttentionKernel attention = AttentionKernel::kVarlen;
  NormKind norm = NormKind::kLayerNorm;
  MlpKind mlp = MlpKind::kGelu;
  bool bias = true;  // biases on every linear layer and LayerNorm's shift
  // Added to the variance (LayerNorm) or mean square (RMS norm); 0: the
  // norm's default (NormEps).
  double norm_eps = 0;
  // Key and value heads (grouped-query attention; query head h reads kv
  // head h / (heads / kv_heads)); 0 means heads.
  int kv_heads = 0;
  // Rotary positions (RoPE, rotate-half pairs as Hugging Face's Llama)
  // instead of a learned table: queries and keys of each head rotated by
  // the token's position in its sample, pair (i, i + head/2) by angle
  // position * rope_base^(-2i / head).
  bool rotary = false;
  float rope_base = 10000.0f;
  // An encoder-decoder (model.kind t5): num_layers encoder layers, then
  // decoder_layers decoder layers; no learned positions, unscaled attention
  // with T5's relative position bias (one table per stack), a final norm per
  // stack, a tied head scaled by hidden^-0.5 (as T5 does).
  bool encoder_decoder = false;
  int decoder_layers = 0;
  int relative_buckets = 32;
  int relative_max_distance = 128;

  // Outputs of the MLP's first projection: ffn, or gate and up (2 ffn).
  bool Gated() const { return mlp == MlpKind::kGatedGelu || mlp == MlpKind::kSwiglu; }
  int MlpWidth() const { return Gated() ? 2 * ffn : ffn; }
  // The norm's default (spec::kDefaultLayerNormEps, kDefaultRmsNormEps)
  // unless norm_eps is set.
  double NormEps() const {
    return norm_eps > 0 ? norm_eps : (norm == NormKind::kRms ? spec::kDefaultRmsNormEps : spec::kDefaultLayerNormEps);
  }
  int HeadSize() const { return hidden / heads; }
  int KvHeads() const { return kv_heads > 0 ? kv_heads : heads; }
  // Outputs of the attention's input projection per token: [q | k | v],
  // hidden queries, then KvHeads() heads of keys and of values.
  int QkvWidth() const { return hidden + 2 * KvHeads() * HeadSize(); }
  // Whether the norms have a shift (LayerNorm in a block with biases).
  bool NormBias() const { return norm == NormKind::kLayerNorm && bias; }
  // Layers of every stack, in the order stages hold them.
  int TotalLayers() const { return num_layers + (encoder_decoder ? decoder_layers : 0); }
  // Elements of the hidden state crossing the stage boundary before layer
  // `layer` (rows x seq x hidden). An encoder-decoder's, as the planner
  // prices it (PipelineModel::BoundaryMb): inside the encoder its hidden
  // state (rows x enc_seq); at the encoder's end its output (after
  // enc.lnf); past it the encoder output followed by the decoder's hidden
  // state (rows x (enc_seq + seq)).
  int64_t BoundaryElements(int64_t rows, int64_t seq, int64_t enc_seq, int layer) const {
    if (!encoder_decoder) return rows * seq * hidden;
    return rows * (layer <= num_layers ? enc_seq : enc_seq + seq) * hidden;
  }

  // INVALID_ARGUMENT naming the field for a spec this model cannot run.
  static absl::StatusOr<GptConfig> FromSpec(const proto::ModelSpec& spec);
  // Llama's block parts: RMS norm, SwiGLU, no biases, rotary positions
  // (heads, kv_heads, norm_eps and rope_base stay as they are).
  void UseLlamaBlock() {
    norm = NormKind::kRms;
    mlp = MlpKind::kSwiglu;
    bias = false;
    rotary = true;
  }
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
  // An encoder-decoder's inputs: rows x enc_seq, each sample's input in the
  // same row and segment id as its target sequence above (which holds the
  // decoder's tokens, segments and targets; positions are unused).
  int64_t enc_seq = 0;
  std::vector<int32_t> enc_tokens;    // pad where no sample
  std::vector<int32_t> enc_segments;  // -1: padding
};

// INVALID_ARGUMENT when the batch's tensors do not match its shape, or a
// token id or position lies outside the model (the embedding kernels of both
// backends trust them).
absl::Status CheckTokenBatch(const TokenBatch& batch, const GptConfig& config);

// An encoder-decoder's tensors that several pipeline stages may hold (each
// copy's gradient summed over them, GptLayout::AddEncoderDecoder): the token
// embedding and each stack's relative position bias table.
inline constexpr const char* kEncoderDecoderShared[] = {"wte", "enc.rel_bias", "dec.rel_bias"};
bool IsEncoderDecoderShared(std::string_view name);

// Which part of the model a stage holds.
struct StageOptions {
  int first_layer = 0;
  int num_layers = 0;
  bool first = true;  // embeds
  bool last = true;   // final LayerNorm, head, loss
  uint64_t seed = 1;
};

struct ParamInfo {
  std::string name;  // e.g. "wte", "h.3.attn.qkv.w", "lnf.b"
  std::vector<int64_t> shape;
  size_t offset = 0;  // in the stage's flat parameter (and gradient, moment) arrays
  size_t size = 0;
  bool decay = false;    // AdamW applies weight decay (matrices)
  bool in_norm = false;  // counts in the global gradient norm
};

// How one parameter tensor starts: a constant, or N(0, std) values drawn from
// the stream `key` (keyed_normal::Normal(key, i, std) for value i), which
// every backend evaluates to the same bits.
struct InitRule {
  size_t offset = 0;  // in the flat parameter array
  size_t size = 0;
  bool normal = false;
  float value = 0;  // the constant, where !normal
  float std = 0;
  uint64_t key = 0;
};

// A run of consecutive parameters [offset, offset + size) sharing a group.
struct ParamRun {
  size_t offset = 0;
  size_t size = 0;
};

class GptLayout {
 public:
  // The offset of a tensor the block does not have (biases of a block
  // without them); backends read it as a null pointer.
  static constexpr size_t kAbsent = static_cast<size_t>(-1);
  struct Layer {  // parameter offsets; ln1_w first, the layer's tensors contiguous
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
    // An encoder-decoder's decoder layer: the cross-attention's norm,
    // query, key-value and output projections (kAbsent elsewhere).
    bool decoder = false;
    size_t ln3_w = kAbsent, xq_w = kAbsent, xkv_w = kAbsent, xproj_w = kAbsent;
  };

  // INVALID_ARGUMENT for a layer range outside the model or first/last flags
  // that disagree with it.
  static absl::StatusOr<GptLayout> Make(const GptConfig& config, const StageOptions& options);

  const GptConfig& config() const { return config_; }
  const StageOptions& options() const { return options_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo* FindParam(const std::string& name) const;
  // Parameters in the flat arrays.
  size_t num_params() const { return num_params_; }
  const std::vector<Layer>& layers() const { return layers_; }
  size_t wte() const { return wte_; }
  size_t wpe() const { return wpe_; }
  size_t lnf_w() const { return lnf_w_; }
  size_t lnf_b() const { return lnf_b_; }
  size_t head() const { return head_; }
  // An encoder-decoder's relative position bias tables, (buckets, heads)
  // each, and the encoder's final norm (kAbsent where the stage holds
  // no layer of that stack, or not the encoder's last).
  size_t enc_rel() const { return enc_rel_; }
  size_t dec_rel() const { return dec_rel_; }
  size_t enc_lnf_w() const { return enc_lnf_w_; }
  // Whether this stage holds a copy of the tied embedding that another stage
  // also holds (tied head, first != last).
  bool HasSharedEmbedding() const { return config_.tie_embeddings && options_.first != options_.last; }
  // Maximal runs of consecutive parameters with decay == want (resp.
  // in_norm == want), for kernels that take one range per launch.
  std::vector<ParamRun> DecayRuns(bool want) const;
  std::vector<ParamRun> NormRuns() const;
  // Writes the initial values (GPT-2 initialisation, residual projections
  // scaled by depth) into `out` (num_params() floats): value i of tensor
  // `name` is InitNormal(seed, name, i, std) whatever the thread count.
  // `threads` <= 0: one per hardware thread, for models of a few million
  // values and more (a GPT-350M takes ~18 s on one thread).
  void Initialize(std::span<float> out, int threads = 0) const;
  // The rules Initialize follows, one per parameter in layout order (a
  // device fills its own memory from them).
  std::vector<InitRule> InitRules() const;

 private:
  GptLayout(const GptConfig& c, const StageOptions& o) : config_(c), options_(o) {}
  size_t Add(const std::string& name, std::vector<int64_t> shape, bool in_norm = true);
  void AddEncoderDecoder();

  GptConfig config_;
  StageOptions options_;
  std::vector<ParamInfo> params_;
  size_t num_params_ = 0;
  std::vector<Layer> layers_;
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_ = 0;
  size_t enc_rel_ = kAbsent, dec_rel_ = kAbsent, enc_lnf_w_ = kAbsent;
};

// Deterministic N(0, std) value number `index` of the tensor `name`
// (src/common/keyed_normal.h over InitKey(seed, name)).
float InitNormal(uint64_t seed, const std::string& name, uint64_t index, float std);
uint64_t InitKey(uint64_t seed, const std::string& name);

}  // namespace dynapipe::runtime::model
