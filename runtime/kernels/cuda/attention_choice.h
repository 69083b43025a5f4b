#pragma once

// Which attention kernel a CUDA process runs for varlen attention, chosen
// once at start-up (the CUDA backend) from the request (--attention-kernel)
// and what the machine offers: cuDNN's fused attention (cudnn_attention.h)
// where the library loads, is new enough for packed sequences on this
// device and passes a start-up comparison with the tiled kernel; the tiled
// kernel (attention.h) otherwise. Host-only logic, tested without a GPU.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynapipe::runtime::cuda {

enum class AttentionImpl {
  kAuto,   // cuDNN where it qualifies, else tiled (logged with the reason)
  kCudnn,  // cuDNN, or the process fails to start (FAILED_PRECONDITION)
  kTiled,  // the tiled kernel always
};

// "auto", "cudnn" or "tiled"; INVALID_ARGUMENT naming --attention-kernel.
absl::StatusOr<AttentionImpl> ParseAttentionImpl(absl::string_view name);
const char* AttentionImplName(AttentionImpl impl);

// cuDNN's packed (THD) attention with per-token statistics and a packed
// backward needs 9.6; below sm_90 packed sequences need 9.18.1.
constexpr size_t kCudnnMinVersion = 90600;
constexpr size_t kCudnnMinVersionBelowSm90 = 91801;

// What the process found. `probe` holds one result per head dimension the
// start-up comparison ran (absent: not run).
struct CudnnFacts {
  absl::Status loaded;  // LoadCudnn's status
  size_t version = 0;   // cudnnGetVersion(), where loaded
  int sm = 0;           // compute capability, major * 10 + minor
  struct Probe {
    int head_dim = 0;
    absl::Status result;
  };
  std::vector<Probe> probes;
};

// OK where cuDNN may run at all on this machine (before any probe);
// FAILED_PRECONDITION with the reason otherwise.
absl::Status CudnnPrerequisites(const CudnnFacts& facts);

struct AttentionDecision {
  std::vector<int> cudnn_head_dims;  // head dimensions cuDNN runs (empty: tiled everywhere)
  std::string line;                  // for the log and /status
};

// The decision for `requested`. kCudnn fails (FAILED_PRECONDITION, naming
// the flag and the reason) where cuDNN cannot run or every probe failed.
absl::StatusOr<AttentionDecision> DecideAttention(AttentionImpl requested, const CudnnFacts& facts);

}  // namespace dynapipe::runtime::cuda
