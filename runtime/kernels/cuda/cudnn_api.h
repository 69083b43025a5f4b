#pragma once

// cuDNN's graph API, loaded at run time (dlopen of libcudnn.so.9) rather than
// linked: a machine without cuDNN still runs the executor, on the tiled
// attention kernel, and says why. Only the few entry points the fused
// attention uses are resolved. Every failing call is reported with the
// operation, the attribute and the library version (one line), so one run
// on a GPU is enough to see what a graph needs.

#include <cudnn_graph.h>

#include <string>

#include "absl/status/statusor.h"

namespace dynapipe::runtime::cuda {

struct CudnnApi {
  size_t (*GetVersion)() = nullptr;
  const char* (*GetErrorString)(cudnnStatus_t) = nullptr;
  void (*GetLastErrorString)(char*, size_t) = nullptr;
  cudnnStatus_t (*Create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*Destroy)(cudnnHandle_t) = nullptr;
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*) = nullptr;
  cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t*, void*) = nullptr;
  cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;

  size_t version = 0;        // cudnnGetVersion() of the loaded library, e.g. 91900
  std::string library_path;  // where it was found

  // "9.19.0" from version.
  std::string VersionString() const;
  // An error for a failed call: "cuDNN 9.19.0: <what> failed: <status name>
  // (<code>): <the library's last error message>".
  absl::Status Error(cudnnStatus_t status, const std::string& what) const;
};

// The loaded library, loaded once per process (later calls return the same
// result). FAILED_PRECONDITION, naming what was searched, where none loads or
// it is older than 9.1 (packed sequences in both passes on sm_90).
absl::StatusOr<const CudnnApi*> LoadCudnn();

// The attribute's name without its CUDNN_ATTR_ prefix ("TENSOR_STRIDES"), for
// messages; "attribute N" for one the attention does not set.
std::string CudnnAttributeName(cudnnBackendAttributeName_t attribute);

// The version the headers here describe (CUDNN_VERSION), for messages.
int CudnnHeaderVersion();

}  // namespace dynapipe::runtime::cuda
