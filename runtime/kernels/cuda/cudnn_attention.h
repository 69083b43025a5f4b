#pragma once

// Causal self-attention over packed sequences through cuDNN's fused
// scaled-dot-product attention (FlashAttention-2 kernels), forward and
// backward, built with cuDNN's graph API (the backend descriptors; no
// frontend library). Same results as AttentionForward / AttentionBackward in
// kVarlen mode (attention.h) up to bf16 rounding: every sequence of the
// micro-batch (ragged.h: each run of one segment in a row) attends causally to
// itself alone; padding tokens belong to no sequence.
//
// Differences from the tiled kernel's contract, which the caller handles:
//   - the statistics are token-major, (B * T, NH) floats, not (B, NH, T);
//   - padding tokens' outputs are not written (the caller zeroes `out`
//     first) and their gradients are not written either (dqkv of padding
//     tokens keeps what it held);
//   - dqkv is written, not accumulated.
//
// Graphs are built per bucket (ragged.h: sequences and length rounded up to
// powers of two) and kept with their execution plans; the first use of a
// bucket compiles cuDNN's kernels (NVRTC), later ones only execute. The
// workspace comes from the caller (the device pool), sized by *Workspace.
//
// Threads: one thread uses an instance, for one stream (SetStream before
// every call: the handle's stream is the one passed in).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/kernels/cuda/cudnn_api.h"
#include "runtime/kernels/cuda/ragged.h"

namespace dynapipe::runtime::cuda {

// Host arrays describing one micro-batch for cuDNN, uploaded as one block by
// the caller (DeviceBytes, Pack) before Forward / Backward use it.
struct CudnnAttentionBatch {
  RaggedBucket bucket;
  std::vector<int32_t> lengths;  // (bucket.sequences)
  // Ragged offsets in elements, (bucket.sequences + 1) each: into qkv and
  // dqkv (token stride 3C), out and dout (C), the statistics (NH).
  std::vector<int64_t> qkv_offsets, out_offsets, stats_offsets;

  // The block's size and layout: the three offset arrays (int64), then the
  // lengths (int32); every part 256-byte aligned from the block's start.
  size_t DeviceBytes() const;
  void Pack(void* host_block) const;  // DeviceBytes() bytes
};

// Builds the arrays from the segments (B, T) on the host. FAILED_PRECONDITION
// where a segment is split within a row (the tiled kernel then runs).
absl::StatusOr<CudnnAttentionBatch> MakeCudnnAttentionBatch(const int32_t* seg_host, int64_t B, int64_t T, int64_t C,
                                                            int64_t NH);

// Whether cuDNN's graphs take this head dimension (multiples of 8 up to 128
// here; both passes).
bool CudnnAttentionSupportsHeadDim(int64_t head_dim);

// Choices in how the backward graph is declared to cuDNN. The defaults are
// the ones the project runs; the others are kept so that a GPU session can
// compare declarations side by side (cudnn_attention_test's hidden
// "variants" case), since cuDNN accepts several that compute different
// things and only a device shows which is right.
//
// Measured on an H200 with cuDNN 9.19 (2026-11-28, deploy/cudnn_variants.sh):
// a ragged dq accumulator gives a wrong dq (relative error ~1, dk and dv
// right) and illegal addresses on many short sequences; every one of the 16
// declarations with a dense accumulator matched the tiled kernel on all five
// cases, and none of the other 16 did. The other four choices made no
// difference.
struct CudnnGraphOptions {
  bool dq_accum_f16x16 = false;    // the dq accumulator declared with F16x16 reordering
  bool dense_dq_accum = true;      // the accumulator (b, H, S, D) dense per sequence, not ragged
  bool dense_row_sum = false;      // rowsum(dout * out) (b, H, S, 1) dense, not ragged
  bool mask_before_stats = false;  // masks applied before the statistics are subtracted
  bool bf16_k = false;             // k (from k^T) as a bf16 virtual tensor, not fp32

  static constexpr int kVariants = 32;
  static CudnnGraphOptions FromBits(int bits);  // bit i = the i-th field above
  std::string ToString() const;
  auto operator<=>(const CudnnGraphOptions&) const = default;
};

// The key of a cached graph: the pass and everything its descriptors hold.
struct CudnnAttentionKey {
  bool backward = false;
  int64_t sequences = 0, max_len = 0, heads = 0, head_dim = 0;
  auto operator<=>(const CudnnAttentionKey&) const = default;
};

// Builds and finalizes every tensor and operation descriptor of the pass
// without a device (no handle: the operation graph, the engines and the plan
// are left out) and returns the number of operations: where the project is
// built, this checks each descriptor's attributes against the loaded
// library.
absl::StatusOr<int64_t> CheckCudnnAttentionOps(const CudnnApi& api, const CudnnAttentionKey& key);

// Builds the pass's graph for the device `device_json` describes (cuDNN's
// device-property JSON) and tries the heuristic's engine configurations in
// order, without a device (cuDNN >= 9.8): the pattern match, the support
// checks and the kernels' compilation run here; loading a compiled kernel
// needs the driver (with the toolkit's stub libcuda it fails at that step).
struct DevicelessPlanReport {
  int64_t configs = 0;                // engine configurations offered for the graph
  int64_t finalized = 0;              // 1 where one became a plan
  std::vector<std::string> failures;  // why each one tried before did not
};
absl::StatusOr<DevicelessPlanReport> PlanCudnnAttentionDeviceless(const CudnnApi& api, const CudnnAttentionKey& key,
                                                                  const std::string& device_json);

class CudnnAttention {
 public:
  // A handle on the current device for work on `stream`.
  static absl::StatusOr<std::unique_ptr<CudnnAttention>> Create(const CudnnApi* api, cudaStream_t stream,
                                                                CudnnGraphOptions options = {});
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Device pointers of an uploaded CudnnAttentionBatch block.
  struct DeviceBatch {
    const int64_t* qkv_offsets = nullptr;
    const int64_t* out_offsets = nullptr;
    const int64_t* stats_offsets = nullptr;
    const int32_t* lengths = nullptr;
  };
  static DeviceBatch Locate(const CudnnAttentionBatch& batch, const void* device_block);

  // Workspace bytes of the pass for this batch's bucket (the graph is built
  // and compiled now where it is new). Backward's includes its fp32 scratch:
  // (B * T, NH) row sums of dO * O and the (B * T, C) dq accumulator.
  absl::StatusOr<size_t> ForwardWorkspace(const CudnnAttentionBatch& batch, int64_t B, int64_t T, int64_t C,
                                          int64_t NH);
  absl::StatusOr<size_t> BackwardWorkspace(const CudnnAttentionBatch& batch, int64_t B, int64_t T, int64_t C,
                                           int64_t NH);

  // out = softmax(q k^T / sqrt(hs), causal per sequence) v for every token of
  // a sequence (padding tokens untouched); stats = each query's natural-log
  // sum of exponentials of its scaled scores, token-major.
  absl::Status Forward(__nv_bfloat16* out,        // (B, T, C), padding untouched
                       float* stats,              // (B * T, NH)
                       const __nv_bfloat16* qkv,  // (B, T, 3C)
                       const CudnnAttentionBatch& batch, const DeviceBatch& device, int64_t B, int64_t T, int64_t C,
                       int64_t NH, void* workspace, size_t workspace_bytes, cudaStream_t stream);

  // dqkv = the gradient of the forward's output against dout (written for
  // every token of a sequence; padding untouched).
  absl::Status Backward(__nv_bfloat16* dqkv,        // (B, T, 3C)
                        const __nv_bfloat16* dout,  // (B, T, C)
                        const __nv_bfloat16* qkv,   // (B, T, 3C)
                        const __nv_bfloat16* out,   // (B, T, C)
                        const float* stats,         // (B * T, NH)
                        const CudnnAttentionBatch& batch, const DeviceBatch& device, int64_t B, int64_t T, int64_t C,
                        int64_t NH, void* workspace, size_t workspace_bytes, cudaStream_t stream);

  // Graphs built so far (each compiled once).
  size_t cached_graphs() const { return graphs_.size(); }
  const CudnnApi& api() const { return *api_; }

  struct Graph;  // descriptors of one pass (cudnn_attention_graph.h)

 private:
  CudnnAttention(const CudnnApi* api, cudnnHandle_t handle, CudnnGraphOptions options);
  absl::StatusOr<Graph*> GraphFor(const CudnnAttentionKey& key);

  const CudnnApi* api_;
  cudnnHandle_t handle_;
  CudnnGraphOptions options_;
  std::map<CudnnAttentionKey, std::unique_ptr<Graph>> graphs_;
};

}  // namespace dynapipe::runtime::cuda
