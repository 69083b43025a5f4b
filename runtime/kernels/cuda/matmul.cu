#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <functional>
#include <string_view>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_util.cuh"
#include "runtime/kernels/cuda/gelu.h"
#include "runtime/kernels/cuda/matmul.h"
#include "src/common/status_macros.h"

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
//
// Epilogues in that mapping:
//   bias (forward): a vector of m = OC values added to every column of D,
//     i.e. to every row-major output row.
//   GELU_AUX_BIAS (forward): D = gelu(A B + bias) and aux = A B + bias, aux
//     col-major (OC, N) with ld OC: the row-major (N, OC) pre-activation.
//   DGELU (dinp): D = gelu'(aux) * (A B), aux col-major (C, N) ld C: the
//     row-major (N, C) pre-activation of the GELU that produced inp.
//   BGRADB (dweight): the sums of op(B) = dout (N, OC) over k = N, one per
//     column of D: n = OC values, in D's type (fp32) -- the bias gradient.
//   residual (forward): C = residual with D's layout and beta = 1.

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

// dst[i] += src[i] (fp32), the epilogue's bias gradient into the accumulated one.
__global__ void AccumulateKernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] += src[i];
  }
}

// The tail of the workspace kept for BGRADB's fp32 bias gradients.
constexpr size_t kBgradReserveBytes = size_t{256} << 10;

}  // namespace

// ---- plans -----------------------------------------------------------------

struct Matmul::Impl {
  enum class Op : int {
    kForward = 0,
    kForwardBias = 1,
    kBackwardInput = 2,
    kBackwardWeight = 3,
    kForwardGelu = 4,        // GELU_AUX (or GELU_AUX_BIAS with a bias)
    kBackwardInputGelu = 5,  // DGELU
    kBackwardWeightBgrad = 6,
  };

  // One column-major Lt product D = op(A) op(B) (+ epilogue), C laid out as D.
  struct Spec {
    cublasOperation_t transa, transb;
    uint64_t a_rows, a_cols;
    int64_t lda;
    uint64_t b_rows, b_cols;
    int64_t ldb;
    uint64_t d_rows, d_cols;
    int64_t ldd;
    cudaDataType_t d_type;
    cublasLtEpilogue_t epilogue;
    int64_t aux_ld;  // GELU epilogues: the aux matrix's leading dimension
  };

  // The forward product's spec (see the mapping at the top).
  static Spec ForwardSpec(int64_t N, int64_t C, int64_t OC, cublasLtEpilogue_t epilogue) {
    const uint64_t n = N, c = C, oc = OC;
    const bool aux = epilogue == CUBLASLT_EPILOGUE_GELU_AUX || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    return {CUBLAS_OP_T, CUBLAS_OP_N, c, oc, C, c, n, C, oc, n, OC, CUDA_R_16BF, epilogue, aux ? OC : 0};
  }

  // The input gradient's spec.
  static Spec InputGradSpec(int64_t N, int64_t C, int64_t OC, cublasLtEpilogue_t epilogue) {
    const uint64_t n = N, c = C, oc = OC;
    return {CUBLAS_OP_N, CUBLAS_OP_N, c, oc, C, oc, n, OC, c, n, C, CUDA_R_16BF, epilogue,
            epilogue == CUBLASLT_EPILOGUE_DGELU ? C : 0};
  }

  // Pointers the epilogue reads or writes; the descriptor's attributes are
  // reset from them on every call.
  struct EpiloguePointers {
    const void* bias = nullptr;  // bias (forward) or bias gradient (BGRADB, written)
    const void* aux = nullptr;   // GELU input (written forward, read backward)
  };

  // Descriptors and the heuristic's algorithm for one (op, m, n, k, pointer
  // alignments); `supported` is false where the heuristic offered none for
  // the epilogue (the caller then takes the unfused path, every time).
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool supported = true;
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

  // (op, m, n, k, bias alignment or 0, aux alignment or 0).
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int>;

  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // all of it
  size_t lt_bytes = 0;         // what cuBLASLt may use: the rest holds BGRADB's output
  bool epilogues = true;
  std::function<void(std::string_view)> warn;
  std::map<Key, std::unique_ptr<Plan>> plans;
  EpilogueCounts counts;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    plans.clear();
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  // fp32 room for BGRADB's output past cuBLASLt's part of the workspace, or
  // null where OC does not fit (or no room was kept).
  float* BgradScratch(int64_t OC) const {
    if (!epilogues || lt_bytes == workspace_bytes) return nullptr;
    if (static_cast<size_t>(OC) * sizeof(float) > workspace_bytes - lt_bytes) return nullptr;
    return reinterpret_cast<float*>(static_cast<char*>(workspace) + lt_bytes);
  }

  static absl::Status SetAttr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* value,
                              size_t size, const char* name) {
    const cublasStatus_t st = cublasLtMatmulDescSetAttribute(desc, attr, value, size);
    if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    return LtStatus(st, name);
  }

  static absl::Status SetPointers(cublasLtMatmulDesc_t desc, const Spec& s, const EpiloguePointers& p) {
    if (p.bias != nullptr) {
      RETURN_IF_ERROR(SetAttr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias),
                                 "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
    }
    if (s.aux_ld > 0) {
      RETURN_IF_ERROR(SetAttr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux),
                                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)"));
    }
    return absl::OkStatus();
  }

  absl::Status BuildPlan(const Spec& s, const EpiloguePointers& p, Plan* plan) {
    DP_LT_RETURN_IF_ERROR("cublasLtMatmulDescCreate",
                          cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t ta = s.transa, tb = s.transb;
    RETURN_IF_ERROR(SetAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta),
                               "cublasLtMatmulDescSetAttribute(TRANSA)"));
    RETURN_IF_ERROR(SetAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb),
                               "cublasLtMatmulDescSetAttribute(TRANSB)"));
    if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      const uint32_t epilogue = s.epilogue;
      RETURN_IF_ERROR(SetAttr(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue),
                                 "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
    }
    if (p.bias != nullptr) {
      // A bias in bf16 (forward), a bias gradient in D's type (fp32).
      const int32_t bias_type = s.epilogue == CUBLASLT_EPILOGUE_BGRADB ? CUDA_R_32F : CUDA_R_16BF;
      RETURN_IF_ERROR(SetAttr(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type),
                                 "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)"));
    }
    if (s.aux_ld > 0) {
      const int64_t ld = s.aux_ld;
      const int32_t aux_type = CUDA_R_16BF;
      RETURN_IF_ERROR(SetAttr(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld),
                                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)"));
      RETURN_IF_ERROR(SetAttr(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                 sizeof(aux_type), "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_DATA_TYPE)"));
    }
    RETURN_IF_ERROR(SetPointers(plan->desc, s, p));
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
    const uint64_t max_ws = lt_bytes;
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
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d,
                                                                    plan->d, pref, 1, &result, &found);
    if (heuristic == CUBLAS_STATUS_SUCCESS && found >= 1 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan->algo = result.algo;
      return absl::OkStatus();
    }
    if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT && s.epilogue != CUBLASLT_EPILOGUE_BIAS) {
      // No algorithm with this epilogue: the caller takes the unfused path.
      if (warn) {
        warn(absl::StrCat("cuBLASLt offers no algorithm for epilogue ", static_cast<int>(s.epilogue), " at m=",
                          s.d_rows, " n=", s.d_cols, " transa=", ta, " transb=", tb, " (",
                          heuristic == CUBLAS_STATUS_SUCCESS ? "none found" : cublasLtGetStatusName(heuristic),
                          "); this shape uses separate kernels"));
      }
      plan->supported = false;
      return absl::OkStatus();
    }
    if (heuristic != CUBLAS_STATUS_SUCCESS) return LtStatus(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    return absl::InternalError(absl::StrCat("cublasLtMatmulAlgoGetHeuristic found no algorithm for m=", s.d_rows,
                                            " n=", s.d_cols, " transa=", ta, " transb=", tb));
  }

  // The cached plan for `op` and this spec, built on first use.
  absl::StatusOr<Plan*> PlanFor(Op op, const Spec& s, int64_t k, const EpiloguePointers& p) {
    const Key key{static_cast<int>(op), static_cast<int64_t>(s.d_rows), static_cast<int64_t>(s.d_cols), k,
                  p.bias != nullptr ? PointerAlignment(p.bias) : 0, p.aux != nullptr ? PointerAlignment(p.aux) : 0};
    auto it = plans.find(key);
    if (it == plans.end()) {
      auto plan = std::make_unique<Plan>();
      RETURN_IF_ERROR(BuildPlan(s, p, plan.get()));
      it = plans.emplace(key, std::move(plan)).first;
    }
    return it->second.get();
  }

  // D = alpha op(A) op(B) + beta C (+ epilogue) through `plan`; C = D unless
  // `c` is given (same layout).
  absl::Status Run(Plan& plan, const Spec& s, const EpiloguePointers& p, const void* A, const void* B, void* D,
                   const void* c, float beta, cudaStream_t stream) {
    RETURN_IF_ERROR(SetPointers(plan.desc, s, p));
    const float alpha = 1.0f;
    DP_LT_RETURN_IF_ERROR("cublasLtMatmul",
                          cublasLtMatmul(handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta,
                                         c != nullptr ? c : D, plan.d, D, plan.d, &plan.algo, workspace, lt_bytes,
                                         stream));
    return absl::OkStatus();
  }

  // A product without an epilogue of its own (bias at most).
  absl::Status RunPlain(Op op, const Spec& s, int64_t k, const EpiloguePointers& p, const void* A, const void* B,
                        void* D, const void* c, float beta, cudaStream_t stream) {
    ASSIGN_OR_RETURN(Plan * plan, PlanFor(op, s, k, p));
    return Run(*plan, s, p, A, B, D, c, beta, stream);
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
    RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "Matmul::Backward ColumnSumKernel launch"));
    ColumnSumFinalizeKernel<<<GridFor(OC), kThreads, 0, stream>>>(partial, dbias, slices, OC);
    return CudaStatus(cudaGetLastError(), "Matmul::Backward ColumnSumFinalizeKernel launch");
  }

  // dweight += inp^T dout and dbias += column sums of dout: one product with
  // the BGRADB epilogue into the workspace's tail, then an fp32 add, where
  // the library has it; else the product and the column-sum kernels.
  absl::Status WeightAndBiasGradient(float* dweight, float* dbias, const bf16* dout, const bf16* inp, int64_t N,
                                     int64_t C, int64_t OC, cudaStream_t stream) {
    const uint64_t n = N, c = C, oc = OC;
    Spec s{CUBLAS_OP_N, CUBLAS_OP_T, c, n, C, oc, n, OC, c, oc, C, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, 0};
    if (float* scratch = dbias != nullptr ? BgradScratch(OC) : nullptr; scratch != nullptr) {
      s.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      const EpiloguePointers p{scratch, nullptr};
      ASSIGN_OR_RETURN(Plan * plan, PlanFor(Op::kBackwardWeightBgrad, s, N, p));
      if (plan->supported) {
        ++counts.fused;
        RETURN_IF_ERROR(Run(*plan, s, p, inp, dout, dweight, nullptr, 1.0f, stream));
        AccumulateKernel<<<GridFor(OC), kThreads, 0, stream>>>(dbias, scratch, OC);
        return CudaStatus(cudaGetLastError(), "Matmul::Backward AccumulateKernel launch");
      }
      ++counts.fallback;
      s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    }
    RETURN_IF_ERROR(RunPlain(Op::kBackwardWeight, s, N, {}, inp, dout, dweight, nullptr, 1.0f, stream));
    if (dbias != nullptr) RETURN_IF_ERROR(BiasGradient(dbias, dout, N, OC, stream));
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Matmul>> Matmul::Create(Options options) {
  auto impl = std::make_unique<Impl>();
  DP_LT_RETURN_IF_ERROR("cublasLtCreate", cublasLtCreate(&impl->handle));
  impl->epilogues = options.epilogues;
  impl->warn = std::move(options.warn);
  if (options.workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->workspace, options.workspace_bytes));  // 256-byte aligned
    impl->workspace_bytes = options.workspace_bytes;
    // Keep the tail for BGRADB where that leaves cuBLASLt at least as much.
    impl->lt_bytes = options.workspace_bytes >= 2 * kBgradReserveBytes
                         ? options.workspace_bytes - kBgradReserveBytes
                         : options.workspace_bytes;
  }
  return std::unique_ptr<Matmul>(new Matmul(std::move(impl)));
}

Matmul::Matmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matmul::~Matmul() = default;
Matmul::Matmul(Matmul&&) noexcept = default;
Matmul& Matmul::operator=(Matmul&&) noexcept = default;

Matmul::EpilogueCounts Matmul::epilogue_counts() const {
  return impl_ != nullptr ? impl_->counts : EpilogueCounts{};
}

#define DP_MATMUL_CHECK_LIVE(fn) \
  if (impl_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(fn, " on a moved-from Matmul"))

absl::Status Matmul::Forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int64_t N, int64_t C,
                             int64_t OC, cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::Forward";
  DP_MATMUL_CHECK_LIVE(kFn);
  RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (N == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointer(kFn, "out", out, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "bias", bias, false));
  const bool has_bias = bias != nullptr;
  const Impl::Spec s = Impl::ForwardSpec(N, C, OC, has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  return impl_->RunPlain(has_bias ? Impl::Op::kForwardBias : Impl::Op::kForward, s, C, {bias, nullptr}, weight, inp,
                         out, nullptr, 0.0f, stream);
}

absl::Status Matmul::ForwardResidual(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                                     const bf16* residual, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::ForwardResidual";
  DP_MATMUL_CHECK_LIVE(kFn);
  RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (N == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointer(kFn, "out", out, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "bias", bias, false));
  RETURN_IF_ERROR(CheckPointer(kFn, "residual", residual, true));
  const bool has_bias = bias != nullptr;
  const Impl::Spec s = Impl::ForwardSpec(N, C, OC, has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  // C = residual with beta 1: the sum is formed in fp32 and rounded once.
  return impl_->RunPlain(has_bias ? Impl::Op::kForwardBias : Impl::Op::kForward, s, C, {bias, nullptr}, weight, inp,
                         out, residual, 1.0f, stream);
}

absl::Status Matmul::ForwardGelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias,
                                 int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::ForwardGelu";
  DP_MATMUL_CHECK_LIVE(kFn);
  RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (OC % 8 != 0) return absl::InvalidArgumentError(absl::StrCat(kFn, ": OC must be a multiple of 8, got ", OC));
  if (N == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointer(kFn, "out", out, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "pre", pre, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "bias", bias, false));
  if (impl_->epilogues) {
    const Impl::Spec s =
        Impl::ForwardSpec(N, C, OC, bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
    const Impl::EpiloguePointers p{bias, pre};
    ASSIGN_OR_RETURN(Impl::Plan * plan, impl_->PlanFor(Impl::Op::kForwardGelu, s, C, p));
    if (plan->supported) {
      ++impl_->counts.fused;
      return impl_->Run(*plan, s, p, weight, inp, out, nullptr, 0.0f, stream);
    }
    ++impl_->counts.fallback;
  }
  RETURN_IF_ERROR(Forward(pre, inp, weight, bias, N, C, OC, stream));
  return GeluForward(out, pre, N * OC, stream);
}

absl::Status Matmul::Backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                              const bf16* weight, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::Backward";
  DP_MATMUL_CHECK_LIVE(kFn);
  RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (N == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointer(kFn, "dinp", dinp, false));
  RETURN_IF_ERROR(CheckPointer(kFn, "dweight", dweight, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "dout", dout, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  if (reinterpret_cast<uintptr_t>(dbias) % alignof(float) != 0) {
    return absl::InvalidArgumentError("Matmul::Backward: dbias is not float-aligned");
  }
  if (dinp != nullptr) {
    const Impl::Spec s = Impl::InputGradSpec(N, C, OC, CUBLASLT_EPILOGUE_DEFAULT);
    RETURN_IF_ERROR(
        impl_->RunPlain(Impl::Op::kBackwardInput, s, OC, {}, weight, dout, dinp, nullptr, 1.0f, stream));
  }
  return impl_->WeightAndBiasGradient(dweight, dbias, dout, inp, N, C, OC, stream);
}

absl::Status Matmul::BackwardThroughGelu(bf16* dpre, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                                         const bf16* weight, const bf16* gelu_pre, int64_t N, int64_t C, int64_t OC,
                                         cudaStream_t stream) {
  constexpr const char* kFn = "Matmul::BackwardThroughGelu";
  DP_MATMUL_CHECK_LIVE(kFn);
  RETURN_IF_ERROR(CheckSizes(kFn, N, C, OC));
  if (C % 8 != 0) return absl::InvalidArgumentError(absl::StrCat(kFn, ": C must be a multiple of 8, got ", C));
  if (N == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointer(kFn, "dpre", dpre, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "dweight", dweight, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "dout", dout, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "inp", inp, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "weight", weight, true));
  RETURN_IF_ERROR(CheckPointer(kFn, "gelu_pre", gelu_pre, true));
  if (reinterpret_cast<uintptr_t>(dbias) % alignof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": dbias is not float-aligned"));
  }
  bool fused = false;
  if (impl_->epilogues) {
    const Impl::Spec s = Impl::InputGradSpec(N, C, OC, CUBLASLT_EPILOGUE_DGELU);
    const Impl::EpiloguePointers p{nullptr, gelu_pre};
    ASSIGN_OR_RETURN(Impl::Plan * plan, impl_->PlanFor(Impl::Op::kBackwardInputGelu, s, OC, p));
    if (plan->supported) {
      ++impl_->counts.fused;
      RETURN_IF_ERROR(impl_->Run(*plan, s, p, weight, dout, dpre, nullptr, 0.0f, stream));
      fused = true;
    } else {
      ++impl_->counts.fallback;
    }
  }
  if (!fused) {
    const Impl::Spec s = Impl::InputGradSpec(N, C, OC, CUBLASLT_EPILOGUE_DEFAULT);
    RETURN_IF_ERROR(
        impl_->RunPlain(Impl::Op::kBackwardInput, s, OC, {}, weight, dout, dpre, nullptr, 0.0f, stream));
    RETURN_IF_ERROR(GeluBackwardInPlace(dpre, gelu_pre, N * C, stream));
  }
  return impl_->WeightAndBiasGradient(dweight, dbias, dout, inp, N, C, OC, stream);
}

}  // namespace dynapipe::runtime::cuda
