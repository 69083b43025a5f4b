#pragma once

// The model laid out over pipeline devices: which layers form each chunk
// (a contiguous run of layers on one device, in pipeline order), what a
// micro-batch costs per chunk, and the memory model per device (parameters,
// gradients and optimizer state, optionally ZeRO-1 sharded, plus activations).

#include <array>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model/layer_cost.h"
#include "proto/model.pb.h"

namespace dynapipe::planner {

struct Chunk {
  int device = 0;
  int first_layer = 0;  // transformer layers [first_layer, first_layer + num_layers)
  int num_encoder = 0;
  int num_decoder = 0;
  bool embedding = false;    // first chunk
  bool postprocess = false;  // last chunk
};

// How many layers of each kind a chunk runs.
inline std::array<std::pair<LayerKind, int>, 4> LayerCounts(const Chunk& c) {
  return {{{LayerKind::kEmbedding, c.embedding ? 1 : 0},
           {LayerKind::kEncoder, c.num_encoder},
           {LayerKind::kDecoder, c.num_decoder},
           {LayerKind::kPostprocess, c.postprocess ? 1 : 0}}};
}

struct ChunkCost {
  double fw_ms = 0;
  double bw_ms = 0;
  double stored_mb = 0;
  double peak_mb = 0;
};

struct MemoryOptions {
  double limit_mb = 80000;  // per device
  int dp = 1;               // data-parallel degree (ZeRO-1 shards over it)
  bool zero1 = false;
  int weight_bytes = 2;     // bytes per parameter of the compute copy
  // A checkpoint's host copy of parameters and both moments
  // (checkpoint_layout::kCopyBytesPerParam) is counted as device memory (CPU
  // devices: PlannerConfig).
  bool checkpoint_copy = false;
};

class PipelineModel {
 public:
  // `layer_to_device[i]` is the pipeline device of transformer layer i; empty
  // means contiguous, as-equal-as-possible ranges over `num_devices`.
  // INVALID_ARGUMENT names the bad field; FAILED_PRECONDITION when the model
  // state alone does not fit on a device.
  static absl::StatusOr<PipelineModel> Create(const proto::ModelSpec& model, int num_devices,
                                              std::span<const int> layer_to_device,
                                              std::shared_ptr<const LayerCostModel> cost, MemoryOptions memory,
                                              WorkModel work = {});

  int num_devices() const { return num_devices_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  // Chunks per device (1 unless interleaved); the bubble divides by it.
  int chunks_per_device() const { return chunks_per_device_; }
  bool interleaved() const { return chunks_per_device_ > 1; }
  bool encoder_decoder() const { return encoder_decoder_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  const LayerCostModel& cost_model() const { return *cost_; }
  const std::shared_ptr<const LayerCostModel>& shared_cost_model() const { return cost_; }
  const MemoryOptions& memory() const { return memory_; }
  // What executors compute of a micro-batch (see WorkShape).
  const WorkModel& work() const { return work_; }

  // Per-chunk costs of one micro-batch; OUT_OF_RANGE passes through from the
  // layer cost model. `out` must hold num_chunks() entries.
  // With `head`: the LM head's own cost at `shape` into *head and the peak
  // of its chunk (the last) without it into *rest_peak, so that the chunk's
  // cost for another number of scored rows follows from one head query
  // (ShapeCosts); zeros where no chunk has the head.
  absl::Status ChunkCosts(const Shape& shape, Recompute r, std::span<ChunkCost> out, LayerCost* head = nullptr,
                          double* rest_peak = nullptr) const;

  // Parameters, gradients and optimizer state on `device`, in MB.
  double StaticMb(int device) const { return static_mb_[device]; }
  // Activation bytes chunk c sends to chunk c+1 (the gradient coming back has
  // the same size), in MB.
  double BoundaryMb(const Shape& shape, int chunk) const;
  int hidden() const { return hidden_; }
  int activation_bytes() const { return activation_bytes_; }
  // Gradient bytes each device all-reduces across data-parallel groups, in MB.
  double GradientMb(int device) const { return grad_mb_[device]; }

 private:
  PipelineModel() = default;

  std::shared_ptr<const LayerCostModel> cost_;
  MemoryOptions memory_;
  WorkModel work_;
  std::vector<Chunk> chunks_;
  // The layer kinds chunks_ holds, in the order a walk over the chunks
  // first meets them (ChunkCosts prices each once, in this order).
  std::vector<LayerKind> kinds_;
  std::vector<double> static_mb_;
  std::vector<double> grad_mb_;
  int num_devices_ = 0;
  int chunks_per_device_ = 1;
  int num_encoder_layers_ = 0;
  bool encoder_decoder_ = false;
  int hidden_ = 0;
  int activation_bytes_ = 2;
};

}  // namespace dynapipe::planner
