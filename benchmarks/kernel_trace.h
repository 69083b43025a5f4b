#pragma once

// The device time of every kernel, copy and fill a stretch of work ran,
// recorded through CUPTI's activity API (what torch.profiler records for
// PyTorch, so both sides of a comparison are measured the same way). CUPTI
// is loaded at run time (libcupti.so of the toolkit, or Python's
// nvidia-cuda-cupti found by bin/dynapipe-env), so the benchmark starts
// without it and only --kernel-trace needs it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::benchmarks {

struct KernelTime {
  std::string name;  // the kernel's (mangled) name, or "[memcpy]" / "[memset]"
  int64_t ns = 0;    // device time
};

// One trace at a time per process (CUPTI's callbacks are global).
class KernelTrace {
 public:
  // Starts recording (the device work queued from now on).
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start();
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Stops recording and returns what ran, in completion order; call once the
  // device finished the traced work.
  absl::StatusOr<std::vector<KernelTime>> Stop();

 private:
  KernelTrace() = default;
  bool stopped_ = false;
};

}  // namespace dynapipe::benchmarks
