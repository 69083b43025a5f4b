#pragma once

// cudaError_t -> absl::Status, so CUDA failures travel like every other
// error; and a host wait for the device that never blocks forever.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace dynapipe::runtime::cuda {

// INTERNAL with the CUDA error name and message, prefixed by `what`.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

// Waits on the host until the device has reached `event`, polling with
// growing pauses (5 us to 1 ms). DEADLINE_EXCEEDED naming `what` when that
// takes longer than `timeout` (a hung kernel, a lost device); INTERNAL for a
// CUDA error.
inline absl::Status WaitForEvent(cudaEvent_t event, std::chrono::seconds timeout, absl::string_view what) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return CudaStatus(q, what);
    if (std::chrono::steady_clock::now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the device did not finish within ", timeout.count(), " s"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// A deadline for WaitForEvent, which counts whole seconds: `d` rounded up,
// at least one.
inline std::chrono::seconds WaitSeconds(absl::Duration d) {
  const int64_t s = absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1)));
  return std::chrono::seconds(s < 1 ? 1 : s);
}

}  // namespace dynapipe::runtime::cuda

// Returns a Status from the enclosing function when a CUDA call fails.
#define CUDA_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                  \
    const cudaError_t dp_cuda_err_ = (expr);                                            \
    if (dp_cuda_err_ != cudaSuccess) return ::dynapipe::runtime::cuda::CudaStatus(dp_cuda_err_, #expr); \
  } while (false)
