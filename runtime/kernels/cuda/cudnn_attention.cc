// cuDNN fused attention over packed sequences, built from backend descriptors.
//
// The graphs are the composite scaled-dot-product attention cuDNN's runtime
// fusion engines recognise (the pattern cuDNN's frontend library lowers its
// SDPA node to on cuDNN 9.x with a causal mask): products with per-sequence
// M/N/K overrides from the lengths, the scale, the padding mask and the
// causal mask as index comparisons with selects, and the softmax written out
// as max / sub / exp / sum / log / div. Notation below: b sequences (the
// bucket), S the bucket's length bound, H heads of D dimensions, TS = 3 H D
// the token stride of qkv, C = H D that of out.
//
// Layout of each graph tensor (dims [b, H, S, D] unless said; strides):
//   q, k, v     [S TS, D, TS, 1] at qkv, qkv + C, qkv + 2C; ragged by the
//               qkv offsets (token start * TS); k enters the first product as
//               its transpose (dims [b, H, D, S], strides [S TS, D, 1, TS]),
//               v likewise in the backward's dP product.
//   out, dout   [S C, D, C, 1], ragged by token start * C.
//   dq, dk, dv  as q, k, v, at dqkv.
//   stats       [b, H, S, 1], strides [H S, 1, H, 1]: token-major (B T, H),
//               ragged by token start * H; the backward's row sums likewise.
//   dq accum    fp32 in out's layout (cuDNN adds into it; then cast to dq).
//   lengths     [b, 1, 1, 1] int32; offsets [b + 1, 1, 1, 1] int64.

#include "runtime/kernels/cuda/cudnn_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/device/cuda_status.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::cuda {
namespace {

constexpr size_t kBlockAlign = 256;
size_t AlignUp(size_t n) { return (n + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

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


using Dims = std::array<int64_t, 4>;

struct TensorSpec {
  const char* name;
  int64_t uid;
  cudnnDataType_t type;
  Dims dims, strides;
  bool is_virtual = false;
  bool by_value = false;
  cudnnBackendDescriptor_t ragged = nullptr;  // offsets tensor, or null
  bool f16x16 = false;                        // declared with F16x16 reordering
};

}  // namespace

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

namespace {

// Builds one graph's descriptors, each failing call named with its context.
class Builder {
 public:
  Builder(CudnnAttention::Graph* g, const CudnnApi& api, cudnnHandle_t handle, std::string graph)
      : g_(g), api_(api), handle_(handle), graph_(std::move(graph)) {}

  // Plans for a described device instead of the handle's (deviceless).
  void set_device(cudnnBackendDescriptor_t device_properties) { device_ = device_properties; }

  absl::StatusOr<cudnnBackendDescriptor_t> New(cudnnBackendDescriptorType_t type, const std::string& what) {
    cudnnBackendDescriptor_t d = nullptr;
    const cudnnStatus_t s = api_.BackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) return Fail(s, absl::StrCat("cudnnBackendCreateDescriptor(", what, ")"));
    g_->owned.push_back(d);
    return d;
  }
  absl::Status Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type,
                   int64_t count, const void* value, const std::string& what) {
    const cudnnStatus_t s = api_.BackendSetAttribute(d, attr, type, count, value);
    if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
    return Fail(s, absl::StrCat("cudnnBackendSetAttribute(", what, ", ", CudnnAttributeName(attr), ")"));
  }
  absl::Status Finalize(cudnnBackendDescriptor_t d, const std::string& what) {
    const cudnnStatus_t s = api_.BackendFinalize(d);
    if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
    return Fail(s, absl::StrCat("cudnnBackendFinalize(", what, ")"));
  }

  absl::StatusOr<cudnnBackendDescriptor_t> Tensor(const TensorSpec& t) {
    const std::string what = absl::StrCat("tensor ", t.name);
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t d, New(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what));
    const int64_t alignment = 16;
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t.type, what));
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data(), what));
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data(), what));
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, what));
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what));
    const bool is_virtual = t.is_virtual, by_value = t.by_value;
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what));
    if (by_value) RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what));
    if (t.ragged != nullptr) {
      RETURN_IF_ERROR(
          Set(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t.ragged, what));
    }
    if (t.f16x16) {
      const cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_F16x16;
      RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder, what));
    }
    RETURN_IF_ERROR(Finalize(d, what));
    return d;
  }

  int64_t NextVirtualUid() { return next_virtual_++; }
  int64_t ops() const { return static_cast<int64_t>(ops_.size()); }

  // A virtual tensor of the given type and layout.
  absl::StatusOr<cudnnBackendDescriptor_t> Virtual(const char* name, cudnnDataType_t type, const Dims& dims,
                                                   const Dims& strides) {
    return Tensor({name, next_virtual_++, type, dims, strides, true, false, nullptr});
  }

  // y = op(x[, b[, t]]) element-wise (broadcasting b and t).
  absl::Status Pointwise(const char* name, cudnnPointwiseMode_t mode, cudnnDataType_t precision,
                         cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                         cudnnBackendDescriptor_t y, int64_t axis = -1) {
    const std::string what = absl::StrCat("pointwise ", name);
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pw, New(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what));
    RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what));
    RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, what));
    if (axis >= 0) RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what));
    RETURN_IF_ERROR(Finalize(pw, what));
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, New(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what));
    RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what));
    if (b != nullptr) {
      RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what));
    }
    if (t != nullptr) {
      RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what));
    }
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what));
    RETURN_IF_ERROR(Finalize(op, what));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  absl::Status Reduction(const char* name, cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                         cudnnBackendDescriptor_t y) {
    const std::string what = absl::StrCat("reduction ", name);
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t r, New(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what));
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    RETURN_IF_ERROR(Set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce, what));
    RETURN_IF_ERROR(Set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, what));
    RETURN_IF_ERROR(Finalize(r, what));
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, New(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, what));
    RETURN_IF_ERROR(Finalize(op, what));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  // c = a b (batched over the first two dims), rows / columns / inner
  // dimension cut per batch entry by the override tensors where given.
  absl::Status Matmul(const char* name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m_override,
                      cudnnBackendDescriptor_t n_override, cudnnBackendDescriptor_t k_override,
                      bool zero_padding = false) {
    const std::string what = absl::StrCat("matmul ", name);
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t mm, New(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what));
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    RETURN_IF_ERROR(Set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, what));
    if (zero_padding) {
      const double padding = 0.0;
      RETURN_IF_ERROR(Set(mm, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding, what));
    }
    RETURN_IF_ERROR(Finalize(mm, what));
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, New(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what));
    if (m_override != nullptr) {
      RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                1, &m_override, what));
    }
    if (n_override != nullptr) {
      RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                1, &n_override, what));
    }
    if (k_override != nullptr) {
      RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                1, &k_override, what));
    }
    RETURN_IF_ERROR(Finalize(op, what));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  absl::Status Reshape(const char* name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const std::string what = absl::StrCat("reshape ", name);
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, New(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what));
    RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what));
    RETURN_IF_ERROR(Finalize(op, what));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  // The operation graph of the ops so far, the heuristic's engine
  // configurations (mode A), and the first that finalizes as a plan.
  absl::Status Plan() {
    const std::string what = absl::StrCat(graph_, " operation graph of ", ops_.size(), " ops");
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t og, New(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what));
    RETURN_IF_ERROR(Set(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              static_cast<int64_t>(ops_.size()), ops_.data(), what));
    if (handle_ != nullptr) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      RETURN_IF_ERROR(Set(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, what));
#pragma GCC diagnostic pop
    }
    RETURN_IF_ERROR(Finalize(og, what));

    const std::string heur_what = absl::StrCat(graph_, " engine heuristics");
    ASSIGN_OR_RETURN(cudnnBackendDescriptor_t heur, New(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, heur_what));
    RETURN_IF_ERROR(
        Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, heur_what));
    if (device_ != nullptr) {
      RETURN_IF_ERROR(
          Set(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &device_, heur_what));
    }
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, heur_what));
    RETURN_IF_ERROR(Finalize(heur, heur_what));
    int64_t count = 0;
    cudnnStatus_t s =
        api_.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    if (s != CUDNN_STATUS_SUCCESS) return Fail(s, absl::StrCat("cudnnBackendGetAttribute(", heur_what, " count)"));
    if (count <= 0) {
      return absl::NotFoundError(absl::StrCat("cuDNN ", api_.VersionString(), ": the heuristic offers no engine for the ",
                                              what, " (the pattern is not one its fusion engines take)"));
    }
    std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(count));
    for (auto& c : configs) {
      ASSIGN_OR_RETURN(c, New(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, heur_what));
    }
    int64_t got = 0;
    s = api_.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                 configs.data());
    if (s != CUDNN_STATUS_SUCCESS) return Fail(s, absl::StrCat("cudnnBackendGetAttribute(", heur_what, " results)"));
    offered_ = got;
    for (int64_t i = 0; i < got; ++i) {
      const std::string plan_what = absl::StrCat(graph_, " execution plan from engine config ", i, " of ", got);
      ASSIGN_OR_RETURN(cudnnBackendDescriptor_t plan, New(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan_what));
      if (device_ != nullptr) {
        RETURN_IF_ERROR(Set(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &device_,
                            plan_what));
      } else {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        RETURN_IF_ERROR(Set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, plan_what));
#pragma GCC diagnostic pop
      }
      RETURN_IF_ERROR(Set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                          &configs[i], plan_what));
      const cudnnStatus_t f = api_.BackendFinalize(plan);
      if (f != CUDNN_STATUS_SUCCESS) {
        failures_.push_back(std::string(api_.Error(f, plan_what).message()));
        continue;
      }
      int64_t ws = 0, n = 0;
      s = api_.BackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
      if (s != CUDNN_STATUS_SUCCESS) return Fail(s, absl::StrCat("cudnnBackendGetAttribute(", plan_what, " workspace)"));
      g_->plan = plan;
      g_->workspace = ws;
      g_->engine_index = i;
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat("no engine configuration of the ", what, " finalizes: ",
                                            absl::StrJoin(failures_, "; ")));
  }

  // What the last Plan found: configurations offered, and why each that did
  // not finalize failed.
  int64_t offered() const { return offered_; }
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  absl::Status Fail(cudnnStatus_t s, const std::string& what) const {
    return api_.Error(s, absl::StrCat(graph_, ": ", what));
  }

  CudnnAttention::Graph* g_;
  const CudnnApi& api_;
  cudnnHandle_t handle_;
  cudnnBackendDescriptor_t device_ = nullptr;
  std::string graph_;
  int64_t offered_ = 0;
  std::vector<std::string> failures_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtualUid;

};

// The shared tensors of both passes.
struct Common {
  cudnnBackendDescriptor_t q, kt, v, o, stats, scale, len_q, len_kv, off_q, off_k, off_v, off_o, off_stats;
  cudnnBackendDescriptor_t neg_padding, neg_causal;
};

// What every pass declares: offsets, lengths, scalars, q, k (transposed), v
// (transposed in the backward, where it enters dout v^T), out and the
// statistics. The two mask fills are separate by-value scalars, as cuDNN's
// frontend declares them.
absl::StatusOr<Common> DeclareCommon(Builder& g, const CudnnAttentionKey& k) {
  const int64_t b = k.sequences, S = k.max_len, H = k.heads, D = k.head_dim, C = H * D, TS = 3 * C;
  Common c{};
  const Dims one{1, 1, 1, 1};
  const Dims off_dims{b + 1, 1, 1, 1}, len_dims{b, 1, 1, 1};
  ASSIGN_OR_RETURN(c.off_q, g.Tensor({"q offsets", kOffQ, CUDNN_DATA_INT64, off_dims, one}));
  ASSIGN_OR_RETURN(c.off_k, g.Tensor({"k offsets", kOffK, CUDNN_DATA_INT64, off_dims, one}));
  ASSIGN_OR_RETURN(c.off_v, g.Tensor({"v offsets", kOffV, CUDNN_DATA_INT64, off_dims, one}));
  ASSIGN_OR_RETURN(c.off_o, g.Tensor({"out offsets", kOffO, CUDNN_DATA_INT64, off_dims, one}));
  ASSIGN_OR_RETURN(c.off_stats, g.Tensor({"stats offsets", kOffStats, CUDNN_DATA_INT64, off_dims, one}));
  ASSIGN_OR_RETURN(c.len_q, g.Tensor({"seq_len_q", kLenQ, CUDNN_DATA_INT32, len_dims, one}));
  ASSIGN_OR_RETURN(c.len_kv, g.Tensor({"seq_len_kv", kLenKv, CUDNN_DATA_INT32, len_dims, one}));
  ASSIGN_OR_RETURN(c.scale, g.Tensor({"scale", kScale, CUDNN_DATA_FLOAT, one, one, false, true}));
  ASSIGN_OR_RETURN(c.neg_padding,
                         g.Tensor({"padding fill", kNegPadding, CUDNN_DATA_FLOAT, one, one, false, true}));
  ASSIGN_OR_RETURN(c.neg_causal, g.Tensor({"causal fill", kNegCausal, CUDNN_DATA_FLOAT, one, one, false, true}));
  const Dims bhsd{b, H, S, D}, token_major{S * TS, D, TS, 1};
  ASSIGN_OR_RETURN(c.q, g.Tensor({"q", kQ, CUDNN_DATA_BFLOAT16, bhsd, token_major, false, false, c.off_q}));
  ASSIGN_OR_RETURN(c.kt, g.Tensor({"k (transposed)", kK, CUDNN_DATA_BFLOAT16, {b, H, D, S}, {S * TS, D, 1, TS},
                                         false, false, c.off_k}));
  if (k.backward) {
    ASSIGN_OR_RETURN(c.v, g.Tensor({"v (transposed)", kV, CUDNN_DATA_BFLOAT16, {b, H, D, S},
                                          {S * TS, D, 1, TS}, false, false, c.off_v}));
  } else {
    ASSIGN_OR_RETURN(c.v, g.Tensor({"v", kV, CUDNN_DATA_BFLOAT16, bhsd, token_major, false, false, c.off_v}));
  }
  ASSIGN_OR_RETURN(
      c.o, g.Tensor({"out", kO, CUDNN_DATA_BFLOAT16, bhsd, {S * C, D, C, 1}, false, false, c.off_o}));
  ASSIGN_OR_RETURN(c.stats, g.Tensor({"stats", kStats, CUDNN_DATA_FLOAT, {b, H, S, 1}, {H * S, 1, H, 1}, false,
                                            false, c.off_stats}));
  return c;
}

// Scores of queries past their sequence's length, or of keys past it, get
// `neg` (the padding mask); then scores of keys after their query (causal,
// top-left: key j is seen by query i iff j <= i). Returns the masked scores.
absl::StatusOr<cudnnBackendDescriptor_t> Masks(Builder& g, const Common& c, const Dims& sq, const Dims& sq_strides,
                                               cudnnBackendDescriptor_t scores) {
  ASSIGN_OR_RETURN(auto row, g.Virtual("padding row index", CUDNN_DATA_INT32, sq, sq_strides));
  ASSIGN_OR_RETURN(auto col, g.Virtual("padding column index", CUDNN_DATA_INT32, sq, sq_strides));
  ASSIGN_OR_RETURN(auto in_q, g.Virtual("query in sequence", CUDNN_DATA_BOOLEAN, sq, sq_strides));
  ASSIGN_OR_RETURN(auto in_kv, g.Virtual("key in sequence", CUDNN_DATA_BOOLEAN, sq, sq_strides));
  ASSIGN_OR_RETURN(auto in_both, g.Virtual("pair in sequence", CUDNN_DATA_BOOLEAN, sq, sq_strides));
  ASSIGN_OR_RETURN(auto padded, g.Virtual("padding-masked scores", CUDNN_DATA_FLOAT, sq, sq_strides));
  RETURN_IF_ERROR(g.Pointwise("row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scores, nullptr, nullptr,
                                    row, 2));
  RETURN_IF_ERROR(g.Pointwise("column index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scores, nullptr,
                                    nullptr, col, 3));
  RETURN_IF_ERROR(
      g.Pointwise("row < seq_len_q", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, c.len_q, nullptr, in_q));
  RETURN_IF_ERROR(
      g.Pointwise("column < seq_len_kv", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, c.len_kv, nullptr, in_kv));
  RETURN_IF_ERROR(
      g.Pointwise("padding and", CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, in_q, in_kv, nullptr, in_both));
  RETURN_IF_ERROR(g.Pointwise("padding select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores,
                                    c.neg_padding, in_both, padded));

  ASSIGN_OR_RETURN(auto crow, g.Virtual("causal row index", CUDNN_DATA_INT32, sq, sq_strides));
  ASSIGN_OR_RETURN(auto ccol, g.Virtual("causal column index", CUDNN_DATA_INT32, sq, sq_strides));
  ASSIGN_OR_RETURN(auto keep, g.Virtual("causal keep", CUDNN_DATA_BOOLEAN, sq, sq_strides));
  ASSIGN_OR_RETURN(auto masked, g.Virtual("masked scores", CUDNN_DATA_FLOAT, sq, sq_strides));
  RETURN_IF_ERROR(g.Pointwise("causal row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, padded, nullptr,
                                    nullptr, crow, 2));
  RETURN_IF_ERROR(g.Pointwise("causal column index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, padded,
                                    nullptr, nullptr, ccol, 3));
  RETURN_IF_ERROR(
      g.Pointwise("row >= column", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, crow, ccol, nullptr, keep));
  RETURN_IF_ERROR(g.Pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, padded,
                                    c.neg_causal, keep, masked));
  return masked;
}

// Forward: S = q k^T (cut to each sequence), scaled, masked; P = softmax(S)
// with stats = max + log(sum of exp); out = P v.
absl::Status BuildForward(Builder& g, const CudnnAttentionKey& k, bool plan) {
  ASSIGN_OR_RETURN(const Common c, DeclareCommon(g, k));
  const int64_t b = k.sequences, S = k.max_len, H = k.heads;
  const Dims sq{b, H, S, S}, sq_strides{H * S * S, S * S, S, 1}, row{b, H, S, 1}, row_strides{H * S, S, 1, 1};
  ASSIGN_OR_RETURN(auto s1, g.Virtual("q k^T", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto s2, g.Virtual("scaled scores", CUDNN_DATA_FLOAT, sq, sq_strides));
  RETURN_IF_ERROR(g.Matmul("q k^T", c.q, c.kt, s1, c.len_q, c.len_kv, nullptr, true));
  RETURN_IF_ERROR(g.Pointwise("scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, c.scale, nullptr, s2));
  ASSIGN_OR_RETURN(auto masked, Masks(g, c, sq, sq_strides, s2));
  ASSIGN_OR_RETURN(auto mx, g.Virtual("row max", CUDNN_DATA_FLOAT, row, row_strides));
  ASSIGN_OR_RETURN(auto z, g.Virtual("scores - max", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto e, g.Virtual("exp", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto sum, g.Virtual("row sum", CUDNN_DATA_FLOAT, row, row_strides));
  ASSIGN_OR_RETURN(auto lg, g.Virtual("log row sum", CUDNN_DATA_FLOAT, row, row_strides));
  ASSIGN_OR_RETURN(auto p, g.Virtual("probabilities", CUDNN_DATA_BFLOAT16, sq, sq_strides));
  RETURN_IF_ERROR(g.Reduction("row max", CUDNN_REDUCE_TENSOR_MAX, masked, mx));
  RETURN_IF_ERROR(g.Pointwise("scores - max", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, mx, nullptr, z));
  RETURN_IF_ERROR(g.Pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, z, nullptr, nullptr, e));
  RETURN_IF_ERROR(g.Reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum));
  RETURN_IF_ERROR(g.Pointwise("log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, lg));
  RETURN_IF_ERROR(g.Pointwise("stats", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, nullptr, c.stats));
  RETURN_IF_ERROR(g.Pointwise("normalise", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, nullptr, p));
  RETURN_IF_ERROR(g.Matmul("P v", p, c.v, c.o, c.len_q, nullptr, c.len_kv));
  return plan ? g.Plan() : absl::OkStatus();
}

// Backward from the stats: P = exp(masked scaled scores - stats); dv = P^T
// dout; dP = dout v^T; dS = (dP - rowsum(dout * out)) * P * scale; dk = dS^T q;
// dq = dS k (through an fp32 accumulator: cuDNN's engines add into it).
absl::Status BuildBackward(Builder& g, const CudnnAttentionKey& k, const CudnnGraphOptions& o, bool plan) {
  ASSIGN_OR_RETURN(const Common c, DeclareCommon(g, k));
  const int64_t b = k.sequences, S = k.max_len, H = k.heads, D = k.head_dim, C = H * D, TS = 3 * C;
  const Dims sq{b, H, S, S}, sq_strides{H * S * S, S * S, S, 1};
  const Dims sq_t_strides{H * S * S, S * S, 1, S};
  const Dims bhsd{b, H, S, D}, token_major{S * TS, D, TS, 1};
  const Dims one{1, 1, 1, 1};
  ASSIGN_OR_RETURN(auto one_t, g.Tensor({"one", kOne, CUDNN_DATA_FLOAT, one, one, false, true}));
  ASSIGN_OR_RETURN(auto dout,
                         g.Tensor({"dout", kDO, CUDNN_DATA_BFLOAT16, bhsd, {S * C, D, C, 1}, false, false, c.off_o}));
  ASSIGN_OR_RETURN(auto dq, g.Tensor({"dq", kDQ, CUDNN_DATA_BFLOAT16, bhsd, token_major, false, false, c.off_q}));
  ASSIGN_OR_RETURN(auto dk, g.Tensor({"dk", kDK, CUDNN_DATA_BFLOAT16, bhsd, token_major, false, false, c.off_k}));
  ASSIGN_OR_RETURN(auto dv, g.Tensor({"dv", kDV, CUDNN_DATA_BFLOAT16, bhsd, token_major, false, false, c.off_v}));
  const TensorSpec row_sum_spec =
      o.dense_row_sum
          ? TensorSpec{"row sums of dout * out", kRowSum, CUDNN_DATA_FLOAT, {b, H, S, 1}, {H * S, S, 1, 1}}
          : TensorSpec{"row sums of dout * out", kRowSum, CUDNN_DATA_FLOAT, {b, H, S, 1}, {H * S, 1, H, 1},
                       false, false, c.off_stats};
  ASSIGN_OR_RETURN(auto row_sum, g.Tensor(row_sum_spec));
  // The accumulator in out's token-major layout (token stride C, not qkv's
  // 3C): a third of the memory a copy of dq's layout would take.
  ASSIGN_OR_RETURN(auto dq_accum, g.Tensor({"dq accumulator", kDQAccum, CUDNN_DATA_FLOAT, bhsd, {S * C, D, C, 1},
                                            false, false, o.dense_dq_accum ? nullptr : c.off_o, o.dq_accum_f16x16}));

  // rowsum(dout * out), times the (absent) dropout scale 1.
  ASSIGN_OR_RETURN(auto t1, g.Virtual("dout * out", CUDNN_DATA_FLOAT, bhsd, {H * S * D, S * D, H * D, 1}));
  ASSIGN_OR_RETURN(auto t2, g.Virtual("rowsum(dout * out)", CUDNN_DATA_FLOAT, {b, H, S, 1}, {H * S, S, 1, 1}));
  RETURN_IF_ERROR(g.Pointwise("dout * out", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, c.o, nullptr, t1));
  RETURN_IF_ERROR(g.Reduction("rowsum(dout * out)", CUDNN_REDUCE_TENSOR_ADD, t1, t2));
  RETURN_IF_ERROR(g.Pointwise("row sums * 1", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, t2, one_t, nullptr, row_sum));

  // P from the stats.
  ASSIGN_OR_RETURN(auto s1, g.Virtual("q k^T", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto s2, g.Virtual("scaled scores", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto s3, g.Virtual("scores - stats", CUDNN_DATA_FLOAT, sq, sq_strides));
  RETURN_IF_ERROR(g.Matmul("q k^T", c.q, c.kt, s1, c.len_q, c.len_kv, nullptr));
  RETURN_IF_ERROR(g.Pointwise("scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, c.scale, nullptr, s2));
  cudnnBackendDescriptor_t masked = nullptr;
  if (o.mask_before_stats) {
    ASSIGN_OR_RETURN(auto m, Masks(g, c, sq, sq_strides, s2));
    RETURN_IF_ERROR(g.Pointwise("scores - stats", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, m, c.stats, nullptr, s3));
    masked = s3;
  } else {
    RETURN_IF_ERROR(g.Pointwise("scores - stats", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s2, c.stats, nullptr, s3));
    ASSIGN_OR_RETURN(masked, Masks(g, c, sq, sq_strides, s3));
  }
  ASSIGN_OR_RETURN(auto p, g.Virtual("probabilities", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto pt, g.Virtual("probabilities^T", CUDNN_DATA_BFLOAT16, sq, sq_t_strides));
  RETURN_IF_ERROR(g.Pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, masked, nullptr, nullptr, p));
  RETURN_IF_ERROR(g.Reshape("P^T", p, pt));
  RETURN_IF_ERROR(g.Matmul("P^T dout", pt, dout, dv, c.len_kv, nullptr, c.len_q));

  // dS.
  ASSIGN_OR_RETURN(auto dp, g.Virtual("dout v^T", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto u1, g.Virtual("dP - row sums", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto u2, g.Virtual("(dP - row sums) P", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto ds, g.Virtual("dS", CUDNN_DATA_FLOAT, sq, sq_strides));
  ASSIGN_OR_RETURN(auto dst, g.Virtual("dS^T", CUDNN_DATA_BFLOAT16, sq, sq_t_strides));
  RETURN_IF_ERROR(g.Matmul("dout v^T", dout, c.v, dp, c.len_q, c.len_kv, nullptr));
  RETURN_IF_ERROR(g.Pointwise("dP - row sums", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, row_sum, nullptr, u1));
  RETURN_IF_ERROR(g.Pointwise("(dP - row sums) P", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, u1, p, nullptr, u2));
  RETURN_IF_ERROR(g.Pointwise("dS scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, u2, c.scale, nullptr, ds));
  RETURN_IF_ERROR(g.Reshape("dS^T", ds, dst));
  RETURN_IF_ERROR(g.Matmul("dS^T q", dst, c.q, dk, c.len_kv, nullptr, c.len_q));

  // dq through the fp32 accumulator.
  ASSIGN_OR_RETURN(auto kn, g.Tensor({"k", g.NextVirtualUid(), o.bf16_k ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT,
                                      bhsd, token_major, true, false, c.off_k}));
  RETURN_IF_ERROR(g.Reshape("k from k^T", c.kt, kn));
  RETURN_IF_ERROR(g.Matmul("dS k", ds, kn, dq_accum, c.len_q, nullptr, c.len_kv));
  RETURN_IF_ERROR(
      g.Pointwise("dq from accumulator", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq));
  return plan ? g.Plan() : absl::OkStatus();
}

// One execution: the variant pack of the given (uid, pointer) pairs.
absl::Status Execute(const CudnnApi& api, cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                     const std::vector<std::pair<int64_t, const void*>>& tensors, void* workspace,
                     const std::string& what) {
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t s = api.BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (s != CUDNN_STATUS_SUCCESS) return api.Error(s, absl::StrCat(what, ": variant pack"));
  struct Destroy {
    const CudnnApi& api;
    cudnnBackendDescriptor_t d;
    ~Destroy() { api.BackendDestroyDescriptor(d); }
  } destroy{api, pack};
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : tensors) {
    uids.push_back(uid);
    ptrs.push_back(const_cast<void*>(ptr));
  }
  const auto n = static_cast<int64_t>(uids.size());
  if ((s = api.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data())) !=
          CUDNN_STATUS_SUCCESS ||
      (s = api.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                                   ptrs.data())) != CUDNN_STATUS_SUCCESS ||
      (s = api.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)) !=
          CUDNN_STATUS_SUCCESS ||
      (s = api.BackendFinalize(pack)) != CUDNN_STATUS_SUCCESS) {
    return api.Error(s, absl::StrCat(what, ": variant pack"));
  }
  s = api.BackendExecute(handle, plan, pack);
  if (s != CUDNN_STATUS_SUCCESS) return api.Error(s, absl::StrCat(what, ": cudnnBackendExecute"));
  return absl::OkStatus();
}

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

absl::StatusOr<int64_t> CheckCudnnAttentionOps(const CudnnApi& api, const CudnnAttentionKey& key) {
  CudnnAttention::Graph g;
  g.api = &api;
  Builder b(&g, api, nullptr, key.backward ? "attention backward (ops only)" : "attention forward (ops only)");
  RETURN_IF_ERROR(key.backward ? BuildBackward(b, key, {}, false) : BuildForward(b, key, false));
  return b.ops();
}

absl::StatusOr<DevicelessPlanReport> PlanCudnnAttentionDeviceless(const CudnnApi& api, const CudnnAttentionKey& key,
                                                                  const std::string& device_json) {
  CudnnAttention::Graph g;
  g.api = &api;
  Builder b(&g, api, nullptr, key.backward ? "attention backward (deviceless)" : "attention forward (deviceless)");
  ASSIGN_OR_RETURN(cudnnBackendDescriptor_t dev, b.New(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties"));
  RETURN_IF_ERROR(b.Set(dev, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                        static_cast<int64_t>(device_json.size()), device_json.data(), "device properties"));
  RETURN_IF_ERROR(b.Finalize(dev, "device properties"));
  b.set_device(dev);
  RETURN_IF_ERROR(key.backward ? BuildBackward(b, key, {}, false) : BuildForward(b, key, false));
  const absl::Status planned = b.Plan();
  if (!planned.ok() && planned.code() != absl::StatusCode::kNotFound) return planned;
  DevicelessPlanReport r;
  r.configs = b.offered();
  r.finalized = planned.ok() ? 1 : 0;
  r.failures = b.failures();
  return r;
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
  Builder b(g.get(), *api_, handle_, name);
  RETURN_IF_ERROR(key.backward ? BuildBackward(b, key, options_, true) : BuildForward(b, key, true));
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
  return Execute(*api_, handle_, g->plan,
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
  return Execute(*api_, handle_, g->plan,
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
