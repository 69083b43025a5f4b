#pragma once

// The CPU backend (runtime/backend/backend.h): host memory, the fp32 GPT
// stage (runtime/model/gpt.h) and Gloo over TCP. What CI trains with, and
// the reference the CUDA backend is checked against.

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/backend/backend.h"

namespace dynapipe::runtime {

// FAILED_PRECONDITION for --comm nccl (CUDA only).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options);

// The job's Gloo communicator over TCP (host memory), as `options` says.
absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectGloo(const ConnectOptions& options,
                                                                comm::KeyValueStore* store);

// Instruction times on the host's steady clock (also what a backend whose
// work completes when its calls return can use).
std::unique_ptr<InstructionTimer> NewHostTimer();

}  // namespace dynapipe::runtime
