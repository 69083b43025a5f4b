#include "runtime/kernels/cuda/cudnn_api.h"

#include <dlfcn.h>

#include <cudnn_version.h>

#include "absl/strings/str_cat.h"

namespace dynapipe::runtime::cuda {
namespace {

// Packed (THD) sequences in both passes on sm_90 came with 9.1.
constexpr size_t kMinVersion = 90100;

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

absl::StatusOr<CudnnApi> Load() {
  // The soname first (LD_LIBRARY_PATH, the rpath: what bin/dynapipe-env
  // finds), then the plain name.
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* err = dlerror();
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", err != nullptr ? err : name);
  }
  if (lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuDNN is not loadable (", tried, "); bin/dynapipe-env adds the toolkit's or Python's nvidia-cudnn "
                     "library directory to LD_LIBRARY_PATH"));
  }
  CudnnApi api;
  char path[4096] = {0};
  if (dlinfo(lib, RTLD_DI_ORIGIN, path) == 0) api.library_path = path;
  bool ok = Resolve(lib, "cudnnGetVersion", &api.GetVersion) &&
            Resolve(lib, "cudnnGetErrorString", &api.GetErrorString) &&
            Resolve(lib, "cudnnGetLastErrorString", &api.GetLastErrorString) &&
            Resolve(lib, "cudnnCreate", &api.Create) && Resolve(lib, "cudnnDestroy", &api.Destroy) &&
            Resolve(lib, "cudnnSetStream", &api.SetStream) &&
            Resolve(lib, "cudnnBackendCreateDescriptor", &api.BackendCreateDescriptor) &&
            Resolve(lib, "cudnnBackendDestroyDescriptor", &api.BackendDestroyDescriptor) &&
            Resolve(lib, "cudnnBackendFinalize", &api.BackendFinalize) &&
            Resolve(lib, "cudnnBackendSetAttribute", &api.BackendSetAttribute) &&
            Resolve(lib, "cudnnBackendGetAttribute", &api.BackendGetAttribute) &&
            Resolve(lib, "cudnnBackendExecute", &api.BackendExecute);
  if (!ok) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat("cuDNN at ", api.library_path, " lacks an entry point (",
                                                      err != nullptr ? err : "dlsym", ")"));
  }
  api.version = api.GetVersion();
  if (api.version < kMinVersion) {
    return absl::FailedPreconditionError(absl::StrCat("cuDNN ", api.VersionString(), " at ", api.library_path,
                                                      " is older than 9.1, which packed attention needs"));
  }
  return api;
}

}  // namespace

std::string CudnnApi::VersionString() const {
  return absl::StrCat(version / 10000, ".", (version % 10000) / 100, ".", version % 100);
}

absl::Status CudnnApi::Error(cudnnStatus_t status, const std::string& what) const {
  char last[1024] = {0};
  if (GetLastErrorString != nullptr) GetLastErrorString(last, sizeof(last));
  const char* name = GetErrorString != nullptr ? GetErrorString(status) : "?";
  return absl::InternalError(absl::StrCat("cuDNN ", VersionString(), ": ", what, " failed: ", name, " (",
                                          static_cast<int>(status), ")", last[0] != '\0' ? ": " : "", last));
}

std::string CudnnAttributeName(cudnnBackendAttributeName_t attribute) {
  switch (attribute) {
    case CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION:
      return "DEVICEPROP_JSON_REPRESENTATION";
    case CUDNN_ATTR_ENGINEHEUR_DEVICEPROP:
      return "ENGINEHEUR_DEVICEPROP";
    case CUDNN_ATTR_ENGINEHEUR_MODE:
      return "ENGINEHEUR_MODE";
    case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
      return "ENGINEHEUR_OPERATION_GRAPH";
    case CUDNN_ATTR_ENGINEHEUR_RESULTS:
      return "ENGINEHEUR_RESULTS";
    case CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP:
      return "EXECUTION_PLAN_DEVICEPROP";
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
      return "EXECUTION_PLAN_ENGINE_CONFIG";
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
      return "EXECUTION_PLAN_WORKSPACE_SIZE";
    case CUDNN_ATTR_MATMUL_COMP_TYPE:
      return "MATMUL_COMP_TYPE";
    case CUDNN_ATTR_MATMUL_PADDING_VALUE:
      return "MATMUL_PADDING_VALUE";
    case CUDNN_ATTR_OPERATIONGRAPH_OPS:
      return "OPERATIONGRAPH_OPS";
    case CUDNN_ATTR_OPERATION_MATMUL_ADESC:
      return "OPERATION_MATMUL_ADESC";
    case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
      return "OPERATION_MATMUL_BDESC";
    case CUDNN_ATTR_OPERATION_MATMUL_CDESC:
      return "OPERATION_MATMUL_CDESC";
    case CUDNN_ATTR_OPERATION_MATMUL_DESC:
      return "OPERATION_MATMUL_DESC";
    case CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC:
      return "OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC";
    case CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC:
      return "OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC";
    case CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC:
      return "OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC";
    case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
      return "OPERATION_POINTWISE_BDESC";
    case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
      return "OPERATION_POINTWISE_PW_DESCRIPTOR";
    case CUDNN_ATTR_OPERATION_POINTWISE_TDESC:
      return "OPERATION_POINTWISE_TDESC";
    case CUDNN_ATTR_OPERATION_POINTWISE_XDESC:
      return "OPERATION_POINTWISE_XDESC";
    case CUDNN_ATTR_OPERATION_POINTWISE_YDESC:
      return "OPERATION_POINTWISE_YDESC";
    case CUDNN_ATTR_OPERATION_REDUCTION_DESC:
      return "OPERATION_REDUCTION_DESC";
    case CUDNN_ATTR_OPERATION_REDUCTION_XDESC:
      return "OPERATION_REDUCTION_XDESC";
    case CUDNN_ATTR_OPERATION_REDUCTION_YDESC:
      return "OPERATION_REDUCTION_YDESC";
    case CUDNN_ATTR_OPERATION_RESHAPE_XDESC:
      return "OPERATION_RESHAPE_XDESC";
    case CUDNN_ATTR_OPERATION_RESHAPE_YDESC:
      return "OPERATION_RESHAPE_YDESC";
    case CUDNN_ATTR_POINTWISE_AXIS:
      return "POINTWISE_AXIS";
    case CUDNN_ATTR_POINTWISE_MATH_PREC:
      return "POINTWISE_MATH_PREC";
    case CUDNN_ATTR_POINTWISE_MODE:
      return "POINTWISE_MODE";
    case CUDNN_ATTR_REDUCTION_COMP_TYPE:
      return "REDUCTION_COMP_TYPE";
    case CUDNN_ATTR_REDUCTION_OPERATOR:
      return "REDUCTION_OPERATOR";
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
      return "TENSOR_BYTE_ALIGNMENT";
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
      return "TENSOR_DATA_TYPE";
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
      return "TENSOR_DIMENSIONS";
    case CUDNN_ATTR_TENSOR_IS_BY_VALUE:
      return "TENSOR_IS_BY_VALUE";
    case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
      return "TENSOR_IS_VIRTUAL";
    case CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC:
      return "TENSOR_RAGGED_OFFSET_DESC";
    case CUDNN_ATTR_TENSOR_STRIDES:
      return "TENSOR_STRIDES";
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
      return "TENSOR_UNIQUE_ID";
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
      return "VARIANT_PACK_DATA_POINTERS";
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
      return "VARIANT_PACK_UNIQUE_IDS";
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
      return "VARIANT_PACK_WORKSPACE";
    default:
      return absl::StrCat("attribute ", static_cast<int>(attribute));
  }
}

absl::StatusOr<const CudnnApi*> LoadCudnn() {
  static const absl::StatusOr<CudnnApi>* const loaded = new absl::StatusOr<CudnnApi>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

int CudnnHeaderVersion() { return CUDNN_VERSION; }

}  // namespace dynapipe::runtime::cuda
