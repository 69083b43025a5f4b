#include "runtime/backend/backend.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "runtime/backend/cpu_backend.h"

namespace dynapipe::runtime {
namespace {

std::atomic<CudaBackendFactory> cuda_factory{nullptr};

}  // namespace

bool RegisterCudaBackend(CudaBackendFactory factory) {
  cuda_factory.store(factory, std::memory_order_release);
  return true;
}

bool CudaBackendBuilt() { return cuda_factory.load(std::memory_order_acquire) != nullptr; }

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  switch (options.kind) {
    case proto::Backend::cpu:
      return CreateCpuBackend(options);
    case proto::Backend::cuda:
      if (const CudaBackendFactory cuda = cuda_factory.load(std::memory_order_acquire)) return cuda(options);
      return absl::FailedPreconditionError(
          "--backend cuda: this program has no CUDA backend (dynapipe-executor from a build where the CUDA toolkit "
          "is installed has it; --config=nocuda builds leave it out)");
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
