// cuDNN fused attention over packed sequences: the batch's ragged offsets,
// the graphs cached per bucket (built in cudnn_attention_graph.cc) and their
// workspaces, and the two passes.

#include "runtime/kernels/cuda/cudnn_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/cudnn_attention_graph.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::cuda {
namespace {

constexpr size_t kBlockAlign = 256;
size_t AlignUp(size_t n) { return (n + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

}  // namespace

// ---- the batch -------------------------------------------------------------

size_t CudnnAttentionBatch::DeviceBytes() const {
  return 3 * AlignUp(qkv_offsets.size() * sizeof(int64_t)) + AlignUp(lengths.size() * sizeof(int32_t));
}

void CudnnAttentionBatch::Pack(void* host_block) const {
  auto* p = static_cast<unsigned char*>(host_block);
  const size_t part = AlignUp(qkv_offsets.size() * sizeof(int64_t));
  std::memset(p, 0, DeviceBytes());
  std::memcpy(p, qkv_offsets.data(), qkv_offsets.size() * sizeof(int64_t));
  std::memcpy(p + part, out_offsets.data(), out_offsets.size() * sizeof(int64_t));
  std::memcpy(p + 2 * part, stats_offsets.data(), stats_offsets.size() * sizeof(int64_t));
  std::memcpy(p + 3 * part, lengths.data(), lengths.size() * sizeof(int32_t));
}

absl::StatusOr<CudnnAttentionBatch> MakeCudnnAttentionBatch(const int32_t* seg_host, int64_t B, int64_t T, int64_t C,
                                                            int64_t NH) {
  ASSIGN_OR_RETURN(const RaggedSequences s, FindSequences(seg_host, B, T));
  CudnnAttentionBatch b;
  b.bucket = BucketFor(s);
  b.lengths = BucketLengths(s, b.bucket);
  b.qkv_offsets = RaggedOffsets(s, b.bucket, 3 * C);
  b.out_offsets = RaggedOffsets(s, b.bucket, C);
  b.stats_offsets = RaggedOffsets(s, b.bucket, NH);
  return b;
}

CudnnGraphOptions CudnnGraphOptions::FromBits(int bits) {
  CudnnGraphOptions o;
  o.dq_accum_f16x16 = (bits & 1) != 0;
  o.dense_dq_accum = (bits & 2) != 0;
  o.dense_row_sum = (bits & 4) != 0;
  o.mask_before_stats = (bits & 8) != 0;
  o.bf16_k = (bits & 16) != 0;
  return o;
}

std::string CudnnGraphOptions::ToString() const {
  std::vector<std::string> on;
  if (dq_accum_f16x16) on.push_back("dq accumulator F16x16");
  on.push_back(dense_dq_accum ? "dense dq accumulator" : "ragged dq accumulator");
  if (dense_row_sum) on.push_back("dense row sums");
  if (mask_before_stats) on.push_back("masks before statistics");
  if (bf16_k) on.push_back("bf16 k");
  return absl::StrJoin(on, ", ");
}

bool CudnnAttentionSupportsHeadDim(int64_t head_dim) { return head_dim > 0 && head_dim <= 128 && head_dim % 8 == 0; }

// ---- the class -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(const CudnnApi* api, cudaStream_t stream,
                                                                       CudnnGraphOptions options) {
  if (api == nullptr) return absl::InvalidArgumentError("CudnnAttention: no cuDNN");
  cudnnHandle_t handle = nullptr;
  cudnnStatus_t s = api->Create(&handle);
  if (s != CUDNN_STATUS_SUCCESS) return api->Error(s, "cudnnCreate");
  std::unique_ptr<CudnnAttention> a(new CudnnAttention(api, handle, options));
  s = api->SetStream(handle, stream);
  if (s != CUDNN_STATUS_SUCCESS) return api->Error(s, "cudnnSetStream");
  return a;
}

CudnnAttention::CudnnAttention(const CudnnApi* api, cudnnHandle_t handle, CudnnGraphOptions options)
    : api_(api), handle_(handle), options_(options) {}

CudnnAttention::~CudnnAttention() {
  graphs_.clear();  // plans before the handle they were built with
  if (handle_ != nullptr) api_->Destroy(handle_);
}

CudnnAttention::DeviceBatch CudnnAttention::Locate(const CudnnAttentionBatch& batch, const void* device_block) {
  const auto* p = static_cast<const unsigned char*>(device_block);
  const size_t part = AlignUp(batch.qkv_offsets.size() * sizeof(int64_t));
  return {reinterpret_cast<const int64_t*>(p), reinterpret_cast<const int64_t*>(p + part),
          reinterpret_cast<const int64_t*>(p + 2 * part), reinterpret_cast<const int32_t*>(p + 3 * part)};
}

absl::StatusOr<CudnnAttention::Graph*> CudnnAttention::GraphFor(const CudnnAttentionKey& key) {
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second.get();
  auto g = std::make_unique<Graph>();
  g->api = api_;
  g->scale = 1.0f / std::sqrt(static_cast<float>(key.head_dim));
  g->neg = api_->version >= 91000 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::lowest();
  const std::string name = absl::StrCat("attention ", key.backward ? "backward" : "forward", " (", key.sequences,
                                        " sequences of <= ", key.max_len, ", ", key.heads, " heads of ", key.head_dim,
                                        ")");
  RETURN_IF_ERROR(cudnn_graph::Build(g.get(), handle_, name, key, options_));
  return graphs_.emplace(key, std::move(g)).first->second.get();
}

absl::StatusOr<size_t> CudnnAttention::ForwardWorkspace(const CudnnAttentionBatch& batch, int64_t /*B*/,
                                                        int64_t /*T*/, int64_t C, int64_t NH) {
  ASSIGN_OR_RETURN(Graph * g,
                         GraphFor({false, batch.bucket.sequences, batch.bucket.max_len, NH, C / NH}));
  return static_cast<size_t>(AlignUp(static_cast<size_t>(g->workspace)));
}

namespace {

// The backward's workspace: the plan's, then the row sums, token-major
// (B T, NH) fp32, then the dq accumulator, (B T, C) fp32 (out's layout).
// The batch's arrays agree with its bucket and stay inside (B, T).
absl::Status CheckBatch(const CudnnAttentionBatch& b, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const auto n = static_cast<size_t>(b.bucket.sequences);
  if (NH <= 0 || C % NH != 0 || !CudnnAttentionSupportsHeadDim(C / NH)) {
    return absl::InvalidArgumentError(absl::StrCat("cuDNN attention: head dimension of C ", C, " / NH ", NH));
  }
  if (b.lengths.size() != n || b.qkv_offsets.size() != n + 1 || b.out_offsets.size() != n + 1 ||
      b.stats_offsets.size() != n + 1) {
    return absl::InvalidArgumentError("cuDNN attention: the batch's arrays do not match its bucket");
  }
  if (b.qkv_offsets.back() > B * T * 3 * C || b.out_offsets.back() > B * T * C) {
    return absl::InvalidArgumentError(absl::StrCat("cuDNN attention: sequences past the ", B, " x ", T, " grid"));
  }
  return absl::OkStatus();
}

struct BackwardLayout {
  size_t row_sum = 0, dq_accum = 0, dq_accum_bytes = 0, total = 0;
};
// A dense tensor has a bucket-sized row per sequence position (sequences x
// length), which can be more than the micro-batch's B x T tokens.
BackwardLayout LayOutBackward(int64_t plan_workspace, const CudnnAttentionBatch& batch, const CudnnGraphOptions& o,
                              int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t ragged_rows = B * T, dense_rows = std::max(B * T, batch.bucket.sequences * batch.bucket.max_len);
  BackwardLayout l;
  l.row_sum = AlignUp(static_cast<size_t>(plan_workspace));
  l.dq_accum = l.row_sum + AlignUp(static_cast<size_t>((o.dense_row_sum ? dense_rows : ragged_rows) * NH) * sizeof(float));
  l.dq_accum_bytes = static_cast<size_t>((o.dense_dq_accum ? dense_rows : ragged_rows) * C) * sizeof(float);
  l.total = l.dq_accum + AlignUp(l.dq_accum_bytes);
  return l;
}

}  // namespace

absl::StatusOr<size_t> CudnnAttention::BackwardWorkspace(const CudnnAttentionBatch& batch, int64_t B, int64_t T,
                                                         int64_t C, int64_t NH) {
  ASSIGN_OR_RETURN(Graph * g, GraphFor({true, batch.bucket.sequences, batch.bucket.max_len, NH, C / NH}));
  return LayOutBackward(g->workspace, batch, options_, B, T, C, NH).total;
}

absl::Status CudnnAttention::Forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv,
                                     const CudnnAttentionBatch& batch, const DeviceBatch& d, int64_t B, int64_t T,
                                     int64_t C, int64_t NH, void* workspace, size_t workspace_bytes,
                                     cudaStream_t stream) {
  RETURN_IF_ERROR(CheckBatch(batch, B, T, C, NH));
  ASSIGN_OR_RETURN(Graph * g, GraphFor({false, batch.bucket.sequences, batch.bucket.max_len, NH, C / NH}));
  if (workspace_bytes < static_cast<size_t>(g->workspace)) {
    return absl::InvalidArgumentError(absl::StrCat("CudnnAttention::Forward: workspace of ", workspace_bytes,
                                                   " bytes, ", g->workspace, " needed"));
  }
  const cudnnStatus_t s = api_->SetStream(handle_, stream);
  if (s != CUDNN_STATUS_SUCCESS) return api_->Error(s, "cudnnSetStream");
  using enum cudnn_graph::Uid;
  return cudnn_graph::Execute(*api_, handle_, g->plan,
                 {{kQ, qkv},
                  {kK, qkv + C},
                  {kV, qkv + 2 * C},
                  {kO, out},
                  {kStats, stats},
                  {kScale, &g->scale},
                  {kNegPadding, &g->neg},
                  {kNegCausal, &g->neg},
                  {kLenQ, d.lengths},
                  {kLenKv, d.lengths},
                  {kOffQ, d.qkv_offsets},
                  {kOffK, d.qkv_offsets},
                  {kOffV, d.qkv_offsets},
                  {kOffO, d.out_offsets},
                  {kOffStats, d.stats_offsets}},
                 workspace, "attention forward");
}

absl::Status CudnnAttention::Backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                      const __nv_bfloat16* out, const float* stats, const CudnnAttentionBatch& batch,
                                      const DeviceBatch& d, int64_t B, int64_t T, int64_t C, int64_t NH,
                                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckBatch(batch, B, T, C, NH));
  ASSIGN_OR_RETURN(Graph * g, GraphFor({true, batch.bucket.sequences, batch.bucket.max_len, NH, C / NH}));
  const BackwardLayout l = LayOutBackward(g->workspace, batch, options_, B, T, C, NH);
  if (workspace_bytes < l.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudnnAttention::Backward: workspace of ", workspace_bytes, " bytes, ", l.total, " needed"));
  }
  auto* ws = static_cast<unsigned char*>(workspace);
  void* row_sum = ws + l.row_sum;
  void* dq_accum = ws + l.dq_accum;
  // The accumulator starts from zero (cuDNN before 9.6 required it; cheap).
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_accum, 0, l.dq_accum_bytes, stream));
  const cudnnStatus_t s = api_->SetStream(handle_, stream);
  if (s != CUDNN_STATUS_SUCCESS) return api_->Error(s, "cudnnSetStream");
  using enum cudnn_graph::Uid;
  return cudnn_graph::Execute(*api_, handle_, g->plan,
                 {{kQ, qkv},
                  {kK, qkv + C},
                  {kV, qkv + 2 * C},
                  {kO, out},
                  {kDO, dout},
                  {kStats, stats},
                  {kDQ, dqkv},
                  {kDK, dqkv + C},
                  {kDV, dqkv + 2 * C},
                  {kRowSum, row_sum},
                  {kDQAccum, dq_accum},
                  {kScale, &g->scale},
                  {kNegPadding, &g->neg},
                  {kNegCausal, &g->neg},
                  {kOne, &g->one},
                  {kLenQ, d.lengths},
                  {kLenKv, d.lengths},
                  {kOffQ, d.qkv_offsets},
                  {kOffK, d.qkv_offsets},
                  {kOffV, d.qkv_offsets},
                  {kOffO, d.out_offsets},
                  {kOffStats, d.stats_offsets}},
                 workspace, "attention backward");
}

}  // namespace dynapipe::runtime::cuda
