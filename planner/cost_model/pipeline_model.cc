#include "planner/cost_model/pipeline_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "src/common/checkpoint_layout.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner {

namespace {

// Equal contiguous ranges; the remainder goes to the middle stages, since the
// first holds the embedding and the last the LM head.
std::vector<int> EqualRanges(int layers, int num_devices) {
  std::vector<int> assign;
  std::vector<int> count(num_devices, layers / num_devices);
  for (int extra = layers % num_devices, d = num_devices > 2 ? 1 : 0; extra > 0; --extra) {
    ++count[d];
    d = d + 1 < num_devices - (num_devices > 2 ? 1 : 0) ? d + 1 : (num_devices > 2 ? 1 : 0);
  }
  for (int d = 0; d < num_devices; ++d) assign.insert(assign.end(), count[d], d);
  return assign;
}

// The device of every layer: `layer_to_device`, or equal ranges when empty;
// every device must get a layer.
absl::StatusOr<std::vector<int>> LayerAssignment(int layers, int num_devices, std::span<const int> layer_to_device) {
  std::vector<int> assign(layer_to_device.begin(), layer_to_device.end());
  if (assign.empty()) {
    if (layers < num_devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallelism.pp: ", num_devices, " stages for only ", layers, " layers"));
    }
    assign = EqualRanges(layers, num_devices);
  }
  if (static_cast<int>(assign.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.layer_to_device: has ", assign.size(),
                                                   " entries for ", layers, " layers"));
  }
  std::vector<int> seen(num_devices, 0);
  for (size_t i = 0; i < assign.size(); ++i) {
    if (assign[i] < 0 || assign[i] >= num_devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallelism.layer_to_device[", i, "]: device ", assign[i], " outside 0..", num_devices - 1));
    }
    seen[assign[i]] = 1;
  }
  for (int d = 0; d < num_devices; ++d) {
    if (!seen[d]) return absl::InvalidArgumentError(absl::StrCat("parallelism.layer_to_device: device ", d, " has no layer"));
  }
  return assign;
}

// One chunk per run of consecutive layers on one device; the first holds the
// embedding, the last the post-processing.
std::vector<Chunk> ChunksOf(const std::vector<int>& assign, int num_encoder_layers) {
  std::vector<Chunk> chunks;
  for (int i = 0; i < static_cast<int>(assign.size()); ++i) {
    if (i == 0 || assign[i] != assign[i - 1]) {
      Chunk c;
      c.device = assign[i];
      c.first_layer = i;
      chunks.push_back(c);
    }
    Chunk& c = chunks.back();
    (i < num_encoder_layers ? c.num_encoder : c.num_decoder)++;
  }
  chunks.front().embedding = true;
  chunks.back().postprocess = true;
  return chunks;
}

// Model state: compute weights + fp32 gradients + an fp32 master copy when
// the compute copy is narrower + Adam's two fp32 moments, ZeRO-1 sharding
// the moments over data-parallel ranks. The master copy stays whole, as
// the executors keep it (CudaGptStage: each rank updates its shard of it
// and the all-gather brings the rest, so the bf16 copy is refreshed from
// whole fp32 values). Fills per device the state and the gradients (MB).
void ModelStateMb(std::span<const Chunk> chunks, const LayerCostModel& lc, const MemoryOptions& memory,
                  int num_devices, std::vector<double>& static_mb, std::vector<double>& grad_mb) {
  const double w = memory.weight_bytes;
  const double master = w < 4 ? 4 : 0;
  const double per_param = w + 4 + master + 8.0 / (memory.zero1 ? std::max(1, memory.dp) : 1) +
                           (memory.checkpoint_copy ? checkpoint_layout::kCopyBytesPerParam : 0);
  static_mb.assign(num_devices, 0);
  grad_mb.assign(num_devices, 0);
  for (const Chunk& c : chunks) {
    double params = c.num_encoder * lc.ParamsMillions(LayerKind::kEncoder) +
                    c.num_decoder * lc.ParamsMillions(LayerKind::kDecoder);
    if (c.embedding) params += lc.ParamsMillions(LayerKind::kEmbedding);
    if (c.postprocess) params += lc.ParamsMillions(LayerKind::kPostprocess);
    static_mb[c.device] += params * per_param;
    grad_mb[c.device] += params * 4;
  }
}

// FAILED_PRECONDITION naming the first device whose model state alone does
// not fit.
absl::Status CheckModelStateFits(std::span<const double> static_mb, const MemoryOptions& memory) {
  for (int d = 0; d < static_cast<int>(static_mb.size()); ++d) {
    if (static_mb[d] >= memory.limit_mb) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model does not fit: device ", d, " needs ", static_cast<int64_t>(static_mb[d]),
          " MB for parameters, gradients and optimizer state",
          memory.checkpoint_copy ? " and the checkpoint's copy of them" : "", "; the limit is ",
          static_cast<int64_t>(memory.limit_mb), " MB"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PipelineModel> PipelineModel::Create(const proto::ModelSpec& model, int num_devices,
                                                    std::span<const int> layer_to_device,
                                                    std::shared_ptr<const LayerCostModel> cost,
                                                    MemoryOptions memory, WorkModel work) {
  if (num_devices <= 0) return absl::InvalidArgumentError("parallelism.pp: must be positive");
  if (model.num_layers() <= 0) return absl::InvalidArgumentError("model.num_layers: must be positive");
  const bool t5 = model.kind() == proto::ModelKind::t5;
  if (t5 && model.num_decoder_layers() <= 0) {
    return absl::InvalidArgumentError("model.num_decoder_layers: must be positive for t5");
  }
  const int layers = model.num_layers() + (t5 ? model.num_decoder_layers() : 0);
  ASSIGN_OR_RETURN(const std::vector<int> assign, LayerAssignment(layers, num_devices, layer_to_device));

  PipelineModel pm;
  pm.cost_ = std::move(cost);
  pm.memory_ = memory;
  pm.work_ = work;
  pm.num_devices_ = num_devices;
  pm.encoder_decoder_ = t5;
  pm.num_encoder_layers_ = model.num_layers();
  pm.hidden_ = model.hidden();
  pm.activation_bytes_ = model.dtype() == proto::DType::fp32 ? 4 : 2;
  pm.chunks_ = ChunksOf(assign, model.num_layers());
  for (const Chunk& c : pm.chunks_) {
    for (const auto& [kind, n] : LayerCounts(c)) {
      if (n > 0 && std::find(pm.kinds_.begin(), pm.kinds_.end(), kind) == pm.kinds_.end()) pm.kinds_.push_back(kind);
    }
  }
  std::vector<int> per_device(num_devices, 0);
  for (const Chunk& c : pm.chunks_) ++per_device[c.device];
  pm.chunks_per_device_ = *std::max_element(per_device.begin(), per_device.end());
  ModelStateMb(pm.chunks_, *pm.cost_, memory, num_devices, pm.static_mb_, pm.grad_mb_);
  RETURN_IF_ERROR(CheckModelStateFits(pm.static_mb_, memory));
  return pm;
}

absl::Status PipelineModel::ChunkCosts(const Shape& shape, Recompute r, std::span<ChunkCost> out, LayerCost* head,
                                       double* rest_peak) const {
  // Each layer kind is priced once per call, whatever the number of chunks.
  LayerCost of[4];
  for (const LayerKind kind : kinds_) {
    ASSIGN_OR_RETURN(of[static_cast<int>(kind)], cost_->Cost(kind, shape, r));
  }
  if (head != nullptr) {
    const Chunk& last = chunks_.back();
    *head = last.postprocess ? of[static_cast<int>(LayerKind::kPostprocess)] : LayerCost{};
    *rest_peak = 0;
    for (const auto& [kind, n] : LayerCounts(last)) {
      if (n > 0 && kind != LayerKind::kPostprocess) *rest_peak = std::max(*rest_peak, of[static_cast<int>(kind)].peak_mb);
    }
  }
  const OverheadTerms overheads = cost_->Overheads();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    ChunkCost& o = out[i];
    o = ChunkCost{};
    o.fw_ms = overheads.micro_batch_fw_ms;
    o.bw_ms = overheads.micro_batch_bw_ms;
    for (const auto& [kind, n] : LayerCounts(chunks_[i])) {
      if (n == 0) continue;
      const LayerCost& l = of[static_cast<int>(kind)];
      o.fw_ms += n * l.fw_ms;
      o.bw_ms += n * l.bw_ms;
      o.stored_mb += n * l.stored_mb;
      o.peak_mb = std::max(o.peak_mb, l.peak_mb);
    }
  }
  return absl::OkStatus();
}

double PipelineModel::BoundaryMb(const Shape& shape, int chunk) const {
  const Chunk& c = chunks_[chunk];
  const double per_token = static_cast<double>(hidden_) * activation_bytes_ / 1e6;
  const bool in_decoder = encoder_decoder_ && c.first_layer + c.num_encoder + c.num_decoder > num_encoder_layers_;
  // Encoder-decoder: once the decoder starts, both the encoder output and the
  // decoder hidden states travel.
  const double tokens = in_decoder ? shape.seq + shape.dec_seq : shape.seq;
  return shape.mbs * tokens * per_token;
}

}  // namespace dynapipe::planner
