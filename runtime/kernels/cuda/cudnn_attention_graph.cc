// The graphs of cuDNN fused attention over packed sequences, built from backend descriptors.
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

#include "runtime/kernels/cuda/cudnn_attention_graph.h"

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::cuda {
namespace cudnn_graph {
namespace {

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

}  // namespace

absl::Status Build(CudnnAttention::Graph* g, cudnnHandle_t handle, const std::string& name,
                   const CudnnAttentionKey& key, const CudnnGraphOptions& options) {
  Builder b(g, *g->api, handle, name);
  return key.backward ? BuildBackward(b, key, options, true) : BuildForward(b, key, true);
}

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

}  // namespace cudnn_graph

absl::StatusOr<int64_t> CheckCudnnAttentionOps(const CudnnApi& api, const CudnnAttentionKey& key) {
  CudnnAttention::Graph g;
  g.api = &api;
  cudnn_graph::Builder b(&g, api, nullptr, key.backward ? "attention backward (ops only)" : "attention forward (ops only)");
  RETURN_IF_ERROR(key.backward ? cudnn_graph::BuildBackward(b, key, {}, false)
                               : cudnn_graph::BuildForward(b, key, false));
  return b.ops();
}

absl::StatusOr<DevicelessPlanReport> PlanCudnnAttentionDeviceless(const CudnnApi& api, const CudnnAttentionKey& key,
                                                                  const std::string& device_json) {
  CudnnAttention::Graph g;
  g.api = &api;
  cudnn_graph::Builder b(&g, api, nullptr, key.backward ? "attention backward (deviceless)" : "attention forward (deviceless)");
  ASSIGN_OR_RETURN(cudnnBackendDescriptor_t dev, b.New(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties"));
  RETURN_IF_ERROR(b.Set(dev, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                        static_cast<int64_t>(device_json.size()), device_json.data(), "device properties"));
  RETURN_IF_ERROR(b.Finalize(dev, "device properties"));
  b.set_device(dev);
  RETURN_IF_ERROR(key.backward ? cudnn_graph::BuildBackward(b, key, {}, false)
                               : cudnn_graph::BuildForward(b, key, false));
  const absl::Status planned = b.Plan();
  if (!planned.ok() && planned.code() != absl::StatusCode::kNotFound) return planned;
  DevicelessPlanReport r;
  r.configs = b.offered();
  r.finalized = planned.ok() ? 1 : 0;
  r.failures = b.failures();
  return r;
}

}  // namespace dynapipe::runtime::cuda
