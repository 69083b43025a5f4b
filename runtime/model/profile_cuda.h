#pragma once

// `dynapipe profile` on a CUDA device: the profiler's grid (profile.h) over
// CudaGptStage, timed with CUDA events on the stage's stream, with stored and
// peak activation memory from the device buffer pool. The profile's device
// is the GPU's name.

#include "absl/status/statusor.h"
#include "proto/cost_profile.pb.h"
#include "runtime/model/layout.h"
#include "runtime/model/profile.h"

namespace dynapipe::runtime::model {

// Profiles on the current CUDA device. FAILED_PRECONDITION without one.
absl::StatusOr<proto::CostProfile> ProfileGptCuda(const GptConfig& config, const ProfileOptions& options);

}  // namespace dynapipe::runtime::model
