#include "runtime/backend/backend.h"

#include "absl/strings/str_cat.h"
#include "runtime/backend/cpu_backend.h"
#ifdef DYNAPIPE_WITH_CUDA
#include "runtime/backend/cuda_backend.h"
#endif

namespace dynapipe::runtime {

bool CudaBackendBuilt() {
#ifdef DYNAPIPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  switch (options.kind) {
    case proto::Backend::cpu:
      return CreateCpuBackend(options);
    case proto::Backend::cuda:
#ifdef DYNAPIPE_WITH_CUDA
      return CreateCudaBackend(options);
#else
      return absl::FailedPreconditionError(
          "--backend cuda: this build has no CUDA backend (built with --config=nocuda; build where the CUDA toolkit "
          "is installed)");
#endif
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: ", proto::Backend::Value_Name(options.kind), " is not a backend (cpu or cuda)"));
}

absl::StatusOr<proto::Backend::Value> ParseBackendKind(absl::string_view name) {
  if (name == "cpu") return proto::Backend::cpu;
  if (name == "cuda") return proto::Backend::cuda;
  return absl::InvalidArgumentError(absl::StrCat("--backend: \"", name, "\" is not a backend (cpu or cuda)"));
}

absl::StatusOr<CommKind> ParseCommKind(absl::string_view name) {
  if (name.empty() || name == "default") return CommKind::kDefault;
  if (name == "gloo") return CommKind::kGloo;
  if (name == "nccl") return CommKind::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("--comm: \"", name, "\" is not a communicator (default, gloo or nccl)"));
}

}  // namespace dynapipe::runtime
