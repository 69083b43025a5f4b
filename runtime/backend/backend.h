#pragma once

// A compute backend: everything device-specific a rank needs, behind one
// interface, so the plan interpreter (runtime/executor/worker.h) runs the
// same code on the CPU (fp32 kernels over OpenBLAS, Gloo) and on a CUDA
// device (bf16 kernels, NCCL, or Gloo with host staging):
//   - memory: the buffer pool of the device and its compute stream;
//   - model: the GPT stage factory (runtime/model/stage.h);
//   - communication: the communicator factory (runtime/comm/comm.h);
//   - small device utilities: host copies, the pairwise gradient sum,
//     instruction timing on the device's clock.
//
// One backend per rank; the executor makes one per process at start-up and
// keeps it across jobs. Threads: a backend is driven by one thread at a time
// (BindThread first on CUDA, which makes its device current there).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/services.pb.h"
#include "proto/report.pb.h"
#include "runtime/comm/comm.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/stage.h"
#include "src/rpc/defaults.h"

namespace dynapipe::runtime {

// Which library carries a backend's pipeline and gradient traffic.
enum class CommKind {
  kDefault,  // the backend's own: Gloo on the CPU, NCCL on CUDA
  kGloo,     // Gloo over TCP (on CUDA: device buffers staged through the host)
  kNccl,     // CUDA only
};

struct BackendOptions {
  proto::Backend::Value kind = proto::Backend::cpu;
  int device = 0;  // CUDA device index
  CommKind comm = CommKind::kDefault;
  // Bounds every host wait for device work (a hung kernel, a lost device).
  absl::Duration device_timeout = absl::Minutes(5);
  // CUDA: the kernel of varlen attention, chosen once at start-up: "auto"
  // (cuDNN's fused attention where it loads, is new enough and agrees with
  // the tiled kernel on a start-up check; the tiled kernel otherwise, with
  // the reason logged), "cudnn" (that, or the backend fails) or "tiled".
  // Describe() names the outcome. The CPU backend refuses "cudnn".
  std::string attention_kernel = "auto";
  // CUDA: the glue around matrix products (bias, residual, GELU and its
  // gradient, bias gradients) in cuBLASLt's epilogues; false: separate kernels.
  bool matmul_epilogues = true;
};

// How a rank joins its job's communicator.
struct ConnectOptions {
  int rank = 0;
  int size = 1;
  std::string job_prefix;                  // unique per job attempt
  std::string listen_address{rpc::kLoopbackHost};  // Gloo: the interface peers connect to
  absl::Duration connect_timeout = comm::kDefaultConnectTimeout;
};

// Marks instruction boundaries on the backend's clock: the host's steady
// clock on the CPU, events on the compute stream on CUDA (so a timing is the
// device's time for the instruction, not the time to enqueue it).
class InstructionTimer {
 public:
  virtual ~InstructionTimer() = default;
  // Marks the start (end) of instruction `index` after the work queued so far.
  virtual absl::Status Begin(int index) = 0;
  virtual absl::Status End(int index) = 0;
  // Waits for the marks (with the backend's deadline) and returns each
  // instruction's [start, end] in ms since the first Begin, in Begin order.
  virtual absl::StatusOr<std::vector<proto::InstructionTiming>> Finish() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual proto::Backend::Value kind() const = 0;
  // A line for logs and status: "cpu", "cuda:0 NVIDIA H100 80GB HBM3", ...
  virtual std::string Describe() const = 0;
  // Makes the backend usable from the calling thread (CUDA: cudaSetDevice).
  virtual absl::Status BindThread() = 0;
  // The type of activations its stages exchange; a plan's tensors must match.
  virtual model::DType activation_dtype() const = 0;

  // Memory for plan slots and activations, on the compute stream.
  virtual BufferPool& pool() = 0;
  virtual StreamHandle stream() const = 0;

  // A stage of the model on this backend, initialised from the layout's seed.
  // INVALID_ARGUMENT (naming the model field) for a model it cannot run.
  virtual absl::StatusOr<std::unique_ptr<model::Stage>> CreateStage(const model::GptConfig& config,
                                                                    const model::StageOptions& options) = 0;
  // The communicator of one job attempt; blocks until every rank joined or
  // connect_timeout passed.
  virtual absl::StatusOr<std::unique_ptr<comm::Communicator>> Connect(const ConnectOptions& options,
                                                                      comm::KeyValueStore* store) = 0;

  // Copies between the host and the backend's memory, ordered after the work
  // queued so far, complete on return.
  virtual absl::Status CopyToHost(void* host, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host, size_t bytes) = 0;
  // a[i] = b[i] = a[i] + b[i] for i < n (the two copies of a tied embedding's
  // gradient on one rank). Enqueued.
  virtual absl::Status SumPair(float* a, float* b, size_t n) = 0;
  // Waits for the work queued so far (with the deadline).
  virtual absl::Status Synchronize() = 0;
  virtual std::unique_ptr<InstructionTimer> NewTimer() = 0;
  // Bounds what the pool may obtain to `bytes` (0: no bound), `what` saying
  // why, for the out-of-memory message. The CPU backend enforces it: a job's
  // declared device memory is the only bound a CPU rank has. A CUDA device's
  // own memory bounds it (no-op).
  virtual void LimitMemory(size_t /*bytes*/, std::string /*what*/) {}
};

// The backend `options.kind` names. FAILED_PRECONDITION, in one line naming
// the flag, where this build lacks it or no device is visible.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// Parses "cpu" / "cuda" (the --backend flag) and "default" / "gloo" / "nccl"
// (--comm); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<proto::Backend::Value> ParseBackendKind(absl::string_view name);
absl::StatusOr<CommKind> ParseCommKind(absl::string_view name);

// Whether this program carries the CUDA backend: programs that may run on
// a GPU link //runtime/backend:backends, which registers it where the build
// has CUDA; the rest (the dynapipe client, CPU tools) link :backend alone and
// need no CUDA library to start.
bool CudaBackendBuilt();

// Called once by the CUDA backend's registration when it is linked in.
using CudaBackendFactory = absl::StatusOr<std::unique_ptr<Backend>> (*)(const BackendOptions&);
bool RegisterCudaBackend(CudaBackendFactory factory);

}  // namespace dynapipe::runtime
