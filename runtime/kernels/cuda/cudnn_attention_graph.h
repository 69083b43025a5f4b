#pragma once

// The cuDNN graphs behind CudnnAttention (cudnn_attention_graph.cc): the
// unique ids of their tensors, the descriptors one pass holds, building and
// planning a pass's graph, and one execution of its plan.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/kernels/cuda/cudnn_api.h"
#include "runtime/kernels/cuda/cudnn_attention.h"

namespace dynapipe::runtime::cuda {

// The descriptors of one pass: everything cuDNN holds for it, its plan, and
// the values of its by-value scalars (read at every execution).
struct CudnnAttention::Graph {
  const CudnnApi* api = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned;  // destroyed in reverse
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;     // the plan's own
  int64_t engine_index = -1;  // for messages
  float scale = 0, neg = 0, one = 1.0f;

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) api->BackendDestroyDescriptor(*it);
  }
};

namespace cudnn_graph {

// Unique ids of the graphs' non-virtual tensors (virtual ones count from
// kFirstVirtualUid).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kLenQ,
  kLenKv,
  kOffQ,
  kOffK,
  kOffV,
  kOffO,
  kOffStats,
  kNegPadding,
  kNegCausal,
  kDO,
  kDQ,
  kDK,
  kDV,
  kRowSum,
  kOne,
  kDQAccum,
  kFirstVirtualUid = 1000,
};

// Builds `key`'s pass into `g` (api, scale and neg set) on `handle` and
// plans it; `name` starts every error message.
absl::Status Build(CudnnAttention::Graph* g, cudnnHandle_t handle, const std::string& name,
                   const CudnnAttentionKey& key, const CudnnGraphOptions& options);

// One execution of `plan`: the variant pack of the given (uid, pointer) pairs.
absl::Status Execute(const CudnnApi& api, cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                     const std::vector<std::pair<int64_t, const void*>>& tensors, void* workspace,
                     const std::string& what);

}  // namespace cudnn_graph
}  // namespace dynapipe::runtime::cuda
