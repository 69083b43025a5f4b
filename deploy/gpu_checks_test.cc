// deploy/gpu_checks.sh, the one-call GPU validation, dry-run on this machine
// (GPU_CHECKS_BACKEND=cpu): unpacking the GPU bundle, the end-to-end job on a
// CPU executor, then the same job killed after its first checkpoint and
// resumed, its losses checked against the uninterrupted run's. What needs a
// GPU (kernel tests, memcheck, the profiler) is skipped there; this is the
// script's own logic, tested before a GPU session depends on it.

#include <catch2/catch.hpp>
#include <string>

#include "src/testing/shell.h"
#include "src/testing/temp_dir.h"

namespace {

using dynapipe::testing::ReadAll;
using dynapipe::testing::Runfiles;
using dynapipe::testing::RunShell;

TEST_CASE("gpu_checks.sh runs its job, kills and resumes it, and reports each step (cpu dry run)") {
  const std::string out = dynapipe::testing::FreshTempDir("gpu_checks");
  const auto run = RunShell("GPU_CHECKS_BACKEND=cpu TOTAL_BUDGET_S=330 E2E_BUDGET_S=90 RESUME_BUDGET_S=90 T5_BUDGET_S=80 bash '" +
                            Runfiles() + "/deploy/gpu_checks.sh' '" + Runfiles() +
                            "/deploy/dynapipe-gpu-bundle.tar.xz' '" + out + "' 2>&1");
  const std::string summary = ReadAll(out + "/gpu-checks-summary.txt");
  INFO(run.text);
  INFO("e2e.log:\n" << ReadAll(out + "/e2e.log"));
  INFO("executor.log (tail):\n" << RunShell("tail -20 '" + out + "/executor.log'").text);
  CHECK(run.rc == 0);
  CHECK(summary.find("e2e cuda-tiny: ok") != std::string::npos);
  CHECK(summary.find("resume cuda-tiny: ok: killed after") != std::string::npos);
  CHECK(summary.find("overlapping the killed run within 0.000000") != std::string::npos);  // the CPU repeats its bits
  CHECK(summary.find("against the uninterrupted run") != std::string::npos);
  CHECK(summary.find("memcheck: skipped (cpu dry run)") != std::string::npos);
  CHECK(summary.find("e2e cuda-t5-tiny: ok") != std::string::npos);     // an encoder-decoder job too
  CHECK(summary.find("e2e cuda-llama-tiny: ok") != std::string::npos);  // and Llama's block
  CHECK(summary.find("0 check(s) failed") != std::string::npos);
}

}  // namespace
