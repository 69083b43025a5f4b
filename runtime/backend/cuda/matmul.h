#pragma once

// Matrix products of the linear layers through cuBLASLt: bf16 operands, fp32
// accumulation (CUBLAS_COMPUTE_32F), row-major shapes and semantics as the
// CPU backend's cpu::MatmulForward / cpu::MatmulBackward. Calls are
// asynchronous on `stream` and return the status of the enqueue.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

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
  // Creates the handle and a `workspace_bytes` device workspace on the current
  // device.
  static absl::StatusOr<std::unique_ptr<Matmul>> Create(size_t workspace_bytes = 32 << 20);

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

  // dinp += dout @ weight (bf16, rounded once), dweight += dout^T @ inp (fp32),
  // dbias += column sums of dout (fp32). dinp and dbias may be null.
  absl::Status Backward(__nv_bfloat16* dinp,          // (N, C) or null, +=
                        float* dweight,               // (OC, C), +=
                        float* dbias,                 // (OC) or null, +=
                        const __nv_bfloat16* dout,    // (N, OC)
                        const __nv_bfloat16* inp,     // (N, C)
                        const __nv_bfloat16* weight,  // (OC, C)
                        int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

 private:
  struct Impl;
  explicit Matmul(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // null only in a moved-from instance
};

}  // namespace dynapipe::runtime::cuda
