#pragma once

// Matrix products of the linear layers through cuBLASLt: bf16 operands, fp32
// accumulation (CUBLAS_COMPUTE_32F), row-major shapes and semantics as the
// CPU backend's cpu::MatmulForward / cpu::MatmulBackward. Calls are
// asynchronous on `stream` and return the status of the enqueue.
//
// The glue around a product runs in cuBLASLt's epilogue where the library
// has one for the shape: the bias (forward), the residual add (as C of
// D = A B + bias + C), GELU with its input kept (GELU_AUX_BIAS), the GELU
// gradient (DGELU) and the bias gradient (BGRADB, fp32, from the weight
// gradient's product). Where the heuristic offers no algorithm for an
// epilogue, the same result comes from the plain product and a separate
// kernel (decided once per shape, logged once); Options::epilogues = false
// asks for that path everywhere (tests compare both).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dynapipe::runtime::cuda {

// Owns a cuBLASLt handle, a device workspace and a cache of matmul plans
// (descriptors and the heuristic's algorithm) keyed by shape, so each shape
// asks the heuristic once.
//
// Threads: an instance is used by one thread, for one stream at a time. Every
// call enqueues work that uses the single workspace (cuBLASLt and the bias
// gradient reduction), so calls on two streams must not overlap; use one
// instance per stream. Destroy it only after its work has completed.
//
// Device pointers passed to Forward/Backward must be 16-byte aligned (the
// cuBLASLt operands and the bias); dbias needs only float alignment. Row
// strides are arbitrary (C, OC need not be multiples of 8).
class Matmul {
 public:
  struct Options {
    // cuBLASLt's workspace plus, at its end, room for the fp32 bias
    // gradients of the BGRADB epilogue (products with OC above that room sum
    // columns in a kernel instead).
    size_t workspace_bytes = size_t{32} << 20;
    bool epilogues = true;
    // Told once per shape whose epilogue falls back (null: silent).
    std::function<void(std::string_view)> warn;
  };
  // Creates the handle and the workspace on the current device.
  static absl::StatusOr<std::unique_ptr<Matmul>> Create(Options options);
  static absl::StatusOr<std::unique_ptr<Matmul>> Create(size_t workspace_bytes = size_t{32} << 20) {
    return Create(Options{workspace_bytes, true, nullptr});
  }

  ~Matmul();
  Matmul(Matmul&&) noexcept;
  Matmul& operator=(Matmul&&) noexcept;
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out = inp @ weight^T + bias (bias broadcast over rows; out overwritten).
  // N == 0 is a no-op; C, OC must be positive.
  absl::Status Forward(__nv_bfloat16* out,           // (N, OC)
                       const __nv_bfloat16* inp,     // (N, C)
                       const __nv_bfloat16* weight,  // (OC, C)
                       const __nv_bfloat16* bias,    // (OC) or null
                       int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

  // out = inp @ weight^T + bias + residual (one rounding to bf16). residual
  // may be out itself (in place); bias may be null.
  absl::Status ForwardResidual(__nv_bfloat16* out,             // (N, OC)
                               const __nv_bfloat16* inp,       // (N, C)
                               const __nv_bfloat16* weight,    // (OC, C)
                               const __nv_bfloat16* bias,      // (OC) or null
                               const __nv_bfloat16* residual,  // (N, OC)
                               int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

  // pre = inp @ weight^T + bias, out = gelu(pre) (tanh form, as GeluForward):
  // the layer's output and the input its backward needs. OC must be a
  // multiple of 8 (the epilogue's leading dimension).
  absl::Status ForwardGelu(__nv_bfloat16* out,           // (N, OC)
                           __nv_bfloat16* pre,           // (N, OC)
                           const __nv_bfloat16* inp,     // (N, C)
                           const __nv_bfloat16* weight,  // (OC, C)
                           const __nv_bfloat16* bias,    // (OC) or null
                           int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

  // dinp += dout @ weight (bf16, rounded once), dweight += dout^T @ inp (fp32),
  // dbias += column sums of dout (fp32). dinp and dbias may be null.
  absl::Status Backward(__nv_bfloat16* dinp,          // (N, C) or null, +=
                        float* dweight,               // (OC, C), +=
                        float* dbias,                 // (OC) or null, +=
                        const __nv_bfloat16* dout,    // (N, OC)
                        const __nv_bfloat16* inp,     // (N, C)
                        const __nv_bfloat16* weight,  // (OC, C)
                        int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

  // Backward of a layer whose input came out of a GELU of `gelu_pre`:
  // dpre = gelu'(gelu_pre) * (dout @ weight), overwritten (not +=), so the
  // gradient goes past the GELU in the product's epilogue; dweight and dbias
  // as Backward. C must be a multiple of 8.
  absl::Status BackwardThroughGelu(__nv_bfloat16* dpre,            // (N, C), overwritten
                                   float* dweight,                 // (OC, C), +=
                                   float* dbias,                   // (OC) or null, +=
                                   const __nv_bfloat16* dout,      // (N, OC)
                                   const __nv_bfloat16* inp,       // (N, C) = gelu(gelu_pre)
                                   const __nv_bfloat16* weight,    // (OC, C)
                                   const __nv_bfloat16* gelu_pre,  // (N, C)
                                   int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

  // Products that ran with a fused epilogue and that fell back to separate
  // kernels, since creation (a plan's decision counts at every call).
  struct EpilogueCounts {
    int64_t fused = 0;
    int64_t fallback = 0;
  };
  EpilogueCounts epilogue_counts() const;

 private:
  struct Impl;
  explicit Matmul(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // null only in a moved-from instance
};

}  // namespace dynapipe::runtime::cuda
