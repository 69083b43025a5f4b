#pragma once

// The CUDA backend (runtime/backend/backend.h) on one device: a non-blocking
// compute stream, a buffer pool over cudaMalloc with CUDA-event fences, the
// mixed-precision GPT stage (runtime/model/gpt_cuda.h: bf16 activations,
// fp32 master weights), NCCL (or Gloo with host staging) for communication,
// and instruction timings from CUDA events on the compute stream (the
// device's time for each instruction, not the host's time to enqueue it).
//
// Every host wait for the device (copies, Synchronize, timings, the
// destructor) polls with options.device_timeout as its deadline.
// Stages, communicators and timers it makes use its stream, pool and copy
// functions: destroy them before the backend.

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/backend/backend.h"

namespace dynapipe::runtime {

// The backend on device `options.device`, made current on the calling
// thread. FAILED_PRECONDITION in one line starting with "--backend cuda: "
// when no CUDA device is visible, naming --device when the index is not one
// of them.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace dynapipe::runtime
