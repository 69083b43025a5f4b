#pragma once

// Per-layer cost queries: the one interface the planner's algorithms use to
// ask "how long and how much memory", implemented from a measured profile or
// from model dimensions and a device description.

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dynapipe::planner {

enum class LayerKind { kEmbedding, kEncoder, kDecoder, kPostprocess };

// Activation recomputation levels (Korthikanti et al. 2022 naming):
// kNone keeps every activation; kSelective drops the attention scores and
// recomputes the attention core; kFull keeps only each layer's input and
// recomputes the whole forward during backward.
enum class Recompute { kNone = 0, kSelective = 1, kFull = 2 };
inline constexpr int kNumRecompute = 3;

const char* LayerKindName(LayerKind kind);
const char* RecomputeName(Recompute r);

// The rows the LM head scores of a sample of `input` tokens (after any
// truncation) and `target` target tokens. Decoder-only: the sequence ends
// with its targets, each scored at the position before it, so a target
// token with no token before it is not scored. Encoder-decoder: every
// decoder token.
inline int64_t ScoredRows(int64_t input, int64_t target, bool encoder_decoder) {
  if (encoder_decoder) return target;
  return input > 0 ? std::min(target, input - 1) : 0;
}

// A padded micro-batch: `mbs` rows of `seq` tokens (and `dec_seq` decoder
// tokens for encoder-decoder models). With a varlen attention kernel
// (decoder-only models) attention computes only the query x key pairs inside
// each sample: `cells`, the sum of the samples' squared lengths (0: the whole
// grid, mbs * seq * seq, as a kernel that masks after computing pays).
//
// `scored`: the rows the LM head computes, the micro-batch's loss tokens
// (both executors run the head, its softmax and its loss on scored rows
// only); 0: every token of the grid (decoder tokens of an encoder-decoder).
struct Shape {
  int mbs = 0;
  int seq = 0;
  int dec_seq = 0;
  int64_t cells = 0;
  int64_t scored = 0;
  bool operator==(const Shape&) const = default;

  // Attention covers the whole grid.
  bool padded() const { return cells == 0; }
  // Rows through the LM head.
  double head_tokens() const {
    return scored > 0 ? static_cast<double>(scored) : static_cast<double>(mbs) * (dec_seq > 0 ? dec_seq : seq);
  }
  // Query x key pairs attention computes (encoder side).
  double work_cells() const {
    return cells > 0 ? static_cast<double>(cells) : static_cast<double>(mbs) * seq * seq;
  }
};

// What an executor computes of a decoder-only micro-batch, and therefore
// what the planner prices (Shape::cells).
struct WorkModel {
  // Attention only between tokens of one sample (model.attention varlen):
  // neither padding nor the other samples of a packed row cost attention.
  bool varlen_attention = false;
};

// The grid `padded` holding samples whose squared lengths sum to `sum_sq`,
// as `work` computes it. Encoder-decoder shapes (dec_seq > 0) stay the grid.
// Inline: the partitioner's table asks it for every run of samples.
inline Shape WorkShape(Shape padded, int64_t sum_sq, const WorkModel& work) {
  padded.cells = 0;
  if (padded.dec_seq > 0 || !work.varlen_attention) return padded;
  const int64_t grid_cells = static_cast<int64_t>(padded.mbs) * padded.seq * padded.seq;
  if (sum_sq != grid_cells) padded.cells = sum_sq;
  return padded;
}

struct LayerCost {
  double fw_ms = 0;
  double bw_ms = 0;      // includes recomputation
  double stored_mb = 0;  // kept from forward until backward
  double peak_mb = 0;    // transient extra while the layer runs
};

// Costs that are not per layer: what a micro-batch costs per model chunk
// beyond its layers (dispatching it, loading its input, handing it on), what
// a transfer between devices costs, and what an iteration costs beyond its
// pipeline (gradient all-reduce, optimizer step). A negative transfer or
// iteration figure means "not known here": the planner then uses the
// cluster's communication model.
struct OverheadTerms {
  double micro_batch_fw_ms = 0;  // per micro-batch per chunk, forward side
  double micro_batch_bw_ms = 0;  // per micro-batch per chunk, backward side
  double transfer_latency_ms = -1;
  double transfer_ms_per_mb = -1;
  double iteration_ms = -1;      // replaces the modelled all-reduce when >= 0
};

class LayerCostModel {
 public:
  virtual ~LayerCostModel() = default;
  // Cost of one layer. OUT_OF_RANGE (naming the shape and the profiled range)
  // when the model cannot answer for this shape.
  virtual absl::StatusOr<LayerCost> Cost(LayerKind kind, const Shape& shape, Recompute r) const = 0;
  // Parameters of one layer of `kind`, in millions.
  virtual double ParamsMillions(LayerKind kind) const = 0;
  // Terms outside the layers (none by default).
  virtual OverheadTerms Overheads() const { return {}; }
  // Short description for reports ("profile h100 (gpt)", "analytic h100-sxm").
  virtual std::string Describe() const = 0;
  // Whether, at a fixed grid (mbs, seq, dec_seq, scored), every figure Cost
  // returns is affine and nondecreasing in Shape::cells (cells > 0), and
  // whether it answers does not depend on the cells: the planner may then
  // price a varlen micro-batch from its grid's line (ShapeCosts) instead of
  // asking per run of samples.
  virtual bool AffineInCells() const { return false; }
  // Whether how Cost grows with the shape (tokens, attention, micro-batch
  // size) was measured on the machine that runs the job (a cost profile):
  // the cost refit then corrects its level, not its shape.
  virtual bool MeasuredShape() const { return false; }
};

}  // namespace dynapipe::planner
