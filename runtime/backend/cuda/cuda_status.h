#pragma once

// cudaError_t -> absl::Status, so CUDA failures travel like every other error.

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dynapipe::runtime::cuda {

// INTERNAL with the CUDA error name and message, prefixed by `what`.
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace dynapipe::runtime::cuda

// Returns a Status from the enclosing function when a CUDA call fails.
#define CUDA_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                  \
    const cudaError_t dp_cuda_err_ = (expr);                                            \
    if (dp_cuda_err_ != cudaSuccess) return ::dynapipe::runtime::cuda::CudaStatus(dp_cuda_err_, #expr); \
  } while (false)
