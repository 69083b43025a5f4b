#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/backend/cuda/cuda_status.h"
#include "runtime/backend/cuda/device_util.cuh"
#include "runtime/backend/cuda/matmul.h"

// Row-major <-> column-major mapping.
//
// cuBLASLt is column-major. A row-major (R, K) matrix with row stride K is,
// byte for byte, the column-major (K, R) matrix with leading dimension K,
// i.e. its transpose. So every row-major product X = Y Z is computed as the
// column-major product X^T = Z^T Y^T, where each row-major operand is passed
// as-is and read by Lt as its own transpose:
//
//   Forward   out(N,OC) = inp(N,C) @ weight(OC,C)^T
//             out^T(OC,N) = weight(OC,C) @ inp^T(C,N)
//             A = weight, stored col-major (C, OC) ld C, transa = T -> (OC, C)
//             B = inp,    stored col-major (C, N)  ld C, transb = N
//             D = out,    col-major (OC, N) ld OC;  m = OC, n = N, k = C.
//             The bias epilogue adds a vector of length m (rows of D) to
//             every column of D: D(o, i) += bias[o], i.e. row-major
//             out[i][o] += bias[o] -- the bias broadcast over the N rows, as
//             wanted, and bias has length OC = m.
//   dinp      dinp(N,C) += dout(N,OC) @ weight(OC,C)
//             dinp^T(C,N) += weight^T(C,OC) @ dout^T(OC,N)
//             A = weight, col-major (C, OC) ld C,  transa = N
//             B = dout,   col-major (OC, N) ld OC, transb = N
//             C = D = dinp, col-major (C, N) ld C; m = C, n = N, k = OC.
//   dweight   dweight(OC,C) += dout^T(OC,N) @ inp(N,C)
//             dweight^T(C,OC) += inp^T(C,N) @ dout(N,OC)
//             A = inp,  col-major (C, N)  ld C,  transa = N
//             B = dout, col-major (OC, N) ld OC, transb = T -> (N, OC)
//             C = D = dweight (fp32), col-major (C, OC) ld C; m = C, n = OC, k = N.

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Every pointer handed to cuBLASLt must have this alignment; the heuristic is
// told so (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), so cached algorithms work
// for any pointers that have it.
constexpr uintptr_t kLtAlignment = 16;

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", cublasLtGetStatusName(s), ": ", cublasLtGetStatusString(s)));
}

#define DP_LT_RETURN_IF_ERROR(name, expr)                                 \
  do {                                                                    \
    const cublasStatus_t dp_lt_status_ = (expr);                          \
    if (dp_lt_status_ != CUBLAS_STATUS_SUCCESS) return LtStatus(dp_lt_status_, name); \
  } while (false)

#define DP_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    const absl::Status dp_status_ = (expr);       \
    if (!dp_status_.ok()) return dp_status_;      \
  } while (false)

absl::Status CheckSizes(const char* fn, int64_t N, int64_t C, int64_t OC) {
  if (N < 0) return absl::InvalidArgumentError(absl::StrCat(fn, ": N must be >= 0, got ", N));
  if (C <= 0) return absl::InvalidArgumentError(absl::StrCat(fn, ": C must be > 0, got ", C));
  if (OC <= 0) return absl::InvalidArgumentError(absl::StrCat(fn, ": OC must be > 0, got ", OC));
  return absl::OkStatus();
}

// A device pointer for cuBLASLt: non-null when `required`, 16-byte aligned.
absl::Status CheckPointer(const char* fn, const char* name, const void* p, bool required) {
  if (p == nullptr) {
    return required ? absl::InvalidArgumentError(absl::StrCat(fn, ": ", name, " is null")) : absl::OkStatus();
  }
  if (reinterpret_cast<uintptr_t>(p) % kLtAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": ", name, " is not 16-byte aligned"));
  }
  return absl::OkStatus();
}

// Largest power of two dividing the address, capped at 256 (the heuristic
// reads the bias pointer's value to infer its alignment).
int PointerAlignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int align = 256; align > 1; align >>= 1) {
    if (a % static_cast<uintptr_t>(align) == 0) return align;
  }
  return 1;
}

// ---- dbias += column sums of dout (N, OC), deterministic -------------------

// A block of (kSumCols, kSumRows) threads sums kSumCols adjacent columns over
// one slice of rows: thread (x, y) takes rows y, y + kSumRows, ... (row reads
// are coalesced across x), then row y == 0 adds the kSumRows partials in a
// fixed order.
constexpr int kSumCols = 32;
constexpr int kSumRows = 8;
// Rows per slice at least this, so each thread sums >= 16 values.
constexpr int64_t kMinRowsPerSlice = 128;
// About this many blocks in all (enough to fill an H100 a few times).
constexpr int64_t kTargetBlocks = 1024;

// Slice blockIdx.y covers rows [blockIdx.y * rows_per_slice, ...). With
// `partial` non-null the slice sum goes to partial[blockIdx.y * OC + col];
// otherwise (one slice) it is added to dbias[col].
__global__ void ColumnSumKernel(const bf16* __restrict__ dout, float* __restrict__ partial,
                                float* __restrict__ dbias, int64_t N, int64_t OC, int64_t rows_per_slice) {
  __shared__ float sums[kSumRows][kSumCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * rows_per_slice;
  const int64_t row_end = row_begin + rows_per_slice < N ? row_begin + rows_per_slice : N;
  float acc = 0.0f;
  if (col < OC) {
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kSumRows) acc += ToF32(dout[r * OC + col]);
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();  // reached by every thread: no early return above
  if (threadIdx.y == 0 && col < OC) {
    float total = 0.0f;
    for (int i = 0; i < kSumRows; ++i) total += sums[i][threadIdx.x];
    if (partial != nullptr) {
      partial[static_cast<int64_t>(blockIdx.y) * OC + col] = total;
    } else {
      dbias[col] += total;
    }
  }
}

// dbias[col] += sum over slices s (in order) of partial[s * OC + col].
__global__ void ColumnSumFinalizeKernel(const float* __restrict__ partial, float* __restrict__ dbias,
                                        int64_t slices, int64_t OC) {
  for (int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; col < OC;
       col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float total = 0.0f;
    for (int64_t s = 0; s < slices; ++s) total += partial[s * OC + col];
    dbias[col] += total;
  }
}

}  // namespace

// ---- plans -----------------------------------------------------------------

struct Matmul::Impl {
  enum class Op : int { kForward = 0, kForwardBias = 1, kBackwardInput = 2, kBackwardWeight = 3 };

  // One column-major Lt product D = op(A) op(B) (+ bias), C == D.
  struct Spec {
    cublasOperation_t transa, transb;
    uint64_t a_rows, a_cols;
    int64_t lda;
    uint64_t b_rows, b_cols;
    int64_t ldb;
    uint64_t d_rows, d_cols;
    int64_t ldd;
    cudaDataType_t d_type;
    bool bias;
  };

  // Descriptors and the heuristic's algorithm for one (op, m, n, k, bias
  // alignment); the bias pointer attribute is reset on every call.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan() {
      if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
      if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
      if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
      if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    }
  };

  // (op, m, n, k, bias alignment or 0).
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int>;

  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<Key, std::unique_ptr<Plan>> plans;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    plans.clear();
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::Status BuildPlan(const Spec& s, const void* bias, Plan* plan) {
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescCreate",
                          cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t ta = s.transa, tb = s.transb;
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescSetAttribute(TRANSA)",
                          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescSetAttribute(TRANSB)",
                          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (s.bias) {
      const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bias_type = CUDA_R_16BF;
      DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescSetAttribute(EPILOGUE)",
                            cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                           sizeof(epilogue)));
      DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)",
                            cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                           &bias_type, sizeof(bias_type)));
      DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescSetAttribute(BIAS_POINTER)",
                            cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                           sizeof(bias)));
    }
    DP_LT_RETURN_IF_ERROR("cublasLtMatrixLayoutCreate(A)",
                          cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, s.a_rows, s.a_cols, s.lda));
    DP_LT_RETURN_IF_ERROR("cublasLtMatrixLayoutCreate(B)",
                          cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, s.b_rows, s.b_cols, s.ldb));
    DP_LT_RETURN_IF_ERROR("cublasLtMatrixLayoutCreate(D)",
                          cublasLtMatrixLayoutCreate(&plan->d, s.d_type, s.d_rows, s.d_cols, s.ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulPreferenceCreate", cublasLtMatmulPreferenceCreate(&pref));
    const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)>
        pref_owner(pref, cublasLtMatmulPreferenceDestroy);
    const uint64_t max_ws = workspace_bytes;
    const uint32_t align = kLtAlignment;
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
                          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &max_ws, sizeof(max_ws)));
    for (const cublasLtMatmulPreferenceAttributes_t attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      DP_LT_RETURN_IF_ERROR("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)",
                            cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulAlgoGetHeuristic",
                          cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                                         pref, 1, &result, &found));
    if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError(absl::StrCat("cublasLtMatmulAlgoGetHeuristic found no algorithm for m=", s.d_rows,
                                              " n=", s.d_cols, " transa=", ta, " transb=", tb,
                                              " bias=", s.bias ? "yes" : "no"));
    }
    plan->algo = result.algo;
    return absl::OkStatus();
  }

  // D = alpha op(A) op(B) + beta D (+ bias), through the cached plan for `key`.
  absl::Status Run(Op op, const Spec& s, int64_t k, const void* A, const void* B, void* D, const void* bias,
                   float beta, cudaStream_t stream) {
    const Key key{static_cast<int>(op), static_cast<int64_t>(s.d_rows), static_cast<int64_t>(s.d_cols), k,
                  s.bias ? PointerAlignment(bias) : 0};
    auto it = plans.find(key);
    if (it == plans.end()) {
      auto plan = std::make_unique<Plan>();
      DP_RETURN_IF_ERROR(BuildPlan(s, bias, plan.get()));
      it = plans.emplace(key, std::move(plan)).first;
    }
    Plan& plan = *it->second;
    if (s.bias) {
      DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescSetAttribute(BIAS_POINTER)",
                            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                           sizeof(bias)));
    }
    const float alpha = 1.0f;
    // In place: C and D are the same pointer with the same layout.
    DP_LT_RETURN_IF_ERROR("cublasLtMatmul",
                          cublasLtMatmul(handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, D, plan.d, D,
                                         plan.d, &plan.algo, workspace, workspace_bytes, stream));
    return absl::OkStatus();
  }

  // dbias += column sums of dout, in fp32, deterministic for a given
  // (N, OC, workspace size): slices of rows write partial sums to the
  // workspace (stream-ordered with the Lt calls that also use it), then one
  // pass adds them in slice order.
  absl::Status BiasGradient(float* dbias, const bf16* dout, int64_t N, int64_t OC, cudaStream_t stream) {
    const int64_t col_blocks = (OC + kSumCols - 1) / kSumCols;
    int64_t slices = (kTargetBlocks + col_blocks - 1) / col_blocks;
    const int64_t by_rows = (N + kMinRowsPerSlice - 1) / kMinRowsPerSlice;
    if (slices > by_rows) slices = by_rows;
    const int64_t by_workspace = static_cast<int64_t>(workspace_bytes / (static_cast<size_t>(OC) * sizeof(float)));
    if (slices > by_workspace) slices = by_workspace;
    if (slices < 1) slices = 1;
    const int64_t rows_per_slice = (N + slices - 1) / slices;
    slices = (N + rows_per_slice - 1) / rows_per_slice;  // no empty slice; <= kTargetBlocks
    if (col_blocks > 0x7fffffff) return absl::InvalidArgumentError("Matmul::Backward: OC too large");
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(slices));
    const dim3 block(kSumCols, kSumRows);
    if (slices == 1) {
      ColumnSumKernel<<<grid, block, 0, stream>>>(dout, nullptr, dbias, N, OC, rows_per_slice);
      return CudaStatus(cudaGetLastError(), "Matmul::Backward ColumnSumKernel launch");
    }
    float* partial = static_cast<float*>(workspace);
    ColumnSumKernel<<<grid, block, 0, stream>>>(dout, partial, nullptr, N, OC, rows_per_slice);
    DP_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "Matmul::Backward ColumnSumKernel launch"));
    ColumnSumFinalizeKernel<<<GridFor(OC), kThreads, 0, stream>>>(partial, dbias, slices, OC);
    return CudaStatus(cudaGetLastError(), "Matmul::Backward ColumnSumFinalizeKernel launch");
  }
};

absl::StatusOr<std::unique_ptr<Matmul>> Matmul::Create(size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  DP_LT_RETURN_IF_ERROR("cublasLtCreate", cublasLtCreate(&impl->handle));
  if (workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->workspace, workspace_bytes));  // 256-byte aligned
    impl->workspace_bytes = workspace_bytes;
  }
  return std::unique_ptr<Matmul>(new Matmul(std::move(impl)));
}

Matmul::Matmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matmul::~Matmul() = default;
Matmul::Matmul(Matmul&&) noexcept = default;
Matmul& Matmul::operator=(Matmul&&) noexcept = default;

absl::Status Matmul::Forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int64_t N, int64_t C,
                             int64_t OC, cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::Forward";
  if (impl_ == nullptr) return absl::FailedPreconditionError("Matmul::Forward on a moved-from Matmul");
  DP_RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (N == 0) return absl::OkStatus();
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "out", out, true));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "bias", bias, false));
  const bool has_bias = bias != nullptr;
  const uint64_t n = N, c = C, oc = OC;
  const Impl::Spec s{CUBLAS_OP_T, CUBLAS_OP_N, c, oc, C, c, n, C, oc, n, OC, CUDA_R_16BF, has_bias};
  return impl_->Run(has_bias ? Impl::Op::kForwardBias : Impl::Op::kForward, s, C, weight, inp, out, bias, 0.0f,
                    stream);
}

absl::Status Matmul::Backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                              const bf16* weight, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::Backward";
  if (impl_ == nullptr) return absl::FailedPreconditionError("Matmul::Backward on a moved-from Matmul");
  DP_RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (N == 0) return absl::OkStatus();
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "dinp", dinp, false));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "dweight", dweight, true));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "dout", dout, true));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  DP_RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  if (reinterpret_cast<uintptr_t>(dbias) % alignof(float) != 0) {
    return absl::InvalidArgumentError("Matmul::Backward: dbias is not float-aligned");
  }
  const uint64_t n = N, c = C, oc = OC;
  if (dinp != nullptr) {
    const Impl::Spec s{CUBLAS_OP_N, CUBLAS_OP_N, c, oc, C, oc, n, OC, c, n, C, CUDA_R_16BF, false};
    DP_RETURN_IF_ERROR(impl_->Run(Impl::Op::kBackwardInput, s, OC, weight, dout, dinp, nullptr, 1.0f, stream));
  }
  {
    const Impl::Spec s{CUBLAS_OP_N, CUBLAS_OP_T, c, n, C, oc, n, OC, c, oc, C, CUDA_R_32F, false};
    DP_RETURN_IF_ERROR(impl_->Run(Impl::Op::kBackwardWeight, s, N, inp, dout, dweight, nullptr, 1.0f, stream));
  }
  if (dbias != nullptr) {
    DP_RETURN_IF_ERROR(impl_->BiasGradient(dbias, dout, N, OC, stream));
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::cuda
