#include "runtime/backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/attention_choice.h"
#include "runtime/kernels/cuda/attention_probe.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/cudnn_attention.h"
#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/kernels/cuda/elementwise.h"
#include "runtime/backend/cpu_backend.h"
#include "runtime/comm/nccl_comm.h"
#include "runtime/comm/staged_comm.h"
#include "runtime/model/gpt_cuda.h"
#include "runtime/model/t5_cuda.h"
#include "src/common/logging.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime {
namespace {

// CUDA events with timing enabled, kept across iterations so a timer does
// not create two events per instruction every iteration. Thread-safe.
class TimingEvents {
 public:
  TimingEvents() = default;
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
  ~TimingEvents() {
    MutexLock lock(&mu_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }

  absl::StatusOr<cudaEvent_t> Take() {
    {
      MutexLock lock(&mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));  // timing enabled
    return e;
  }
  // Events may still be pending on a stream: recording one again later is
  // allowed (a query then refers to the newest record).
  void Give(const std::vector<cudaEvent_t>& events) {
    MutexLock lock(&mu_);
    free_.insert(free_.end(), events.begin(), events.end());
  }

 private:
  Mutex mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
};

// Instruction boundaries as events on the compute stream: a timing is the
// device's time between the work queued before Begin and before End.
// Threads: the backend's driving thread.
class CudaTimer final : public InstructionTimer {
 public:
  CudaTimer(TimingEvents* events, cudaStream_t stream, std::chrono::seconds timeout)
      : events_(events), stream_(stream), timeout_(timeout) {}
  ~CudaTimer() override { Recycle(); }

  absl::Status Begin(int index) override {
    ASSIGN_OR_RETURN(cudaEvent_t e, Record());
    marks_.push_back({index, e, nullptr});
    return absl::OkStatus();
  }
  absl::Status End(int index) override {
    if (marks_.empty() || marks_.back().index != index || marks_.back().end != nullptr) {
      return absl::InternalError(absl::StrCat("timer: End(", index, ") without its Begin"));
    }
    ASSIGN_OR_RETURN(marks_.back().end, Record());
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<proto::InstructionTiming>> Finish() override {
    std::vector<proto::InstructionTiming> out;
    if (marks_.empty()) return out;
    // The newest event is recorded last on the one stream: once it passed,
    // so did every other.
    const Mark& last = marks_.back();
    RETURN_IF_ERROR(cuda::WaitForEvent(last.end != nullptr ? last.end : last.begin, timeout_, "instruction timings"));
    const cudaEvent_t origin = marks_.front().begin;
    out.reserve(marks_.size());
    for (const Mark& m : marks_) {
      float start = 0, end = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&start, origin, m.begin));
      end = start;
      if (m.end != nullptr) CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&end, origin, m.end));
      proto::InstructionTiming t;
      t.set_index(m.index);
      t.set_start_ms(start);
      t.set_end_ms(end);
      out.push_back(std::move(t));
    }
    Recycle();
    return out;
  }

 private:
  struct Mark {
    int index;
    cudaEvent_t begin, end;
  };
  absl::StatusOr<cudaEvent_t> Record() {
    ASSIGN_OR_RETURN(cudaEvent_t e, events_->Take());
    taken_.push_back(e);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(e, stream_));
    return e;
  }
  void Recycle() {
    events_->Give(taken_);
    taken_.clear();
    marks_.clear();
  }

  TimingEvents* events_;
  cudaStream_t stream_;
  std::chrono::seconds timeout_;
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> taken_;  // every event of marks_, returned together
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const BackendOptions& o, std::string device_name, int sm)
      : device_(o.device),
        comm_(o.comm),
        timeout_(o.device_timeout),
        name_(std::move(device_name)),
        sm_(sm),
        epilogues_(o.matmul_epilogues) {}

  // Creates the stream, the pool and the wait event on the current device,
  // then chooses the attention kernel.
  absl::Status Init(cuda::AttentionImpl attention) {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    pool_ = std::make_unique<BufferPool>(&allocator_, &fences_, timeout_);
    return ChooseAttention(attention);
  }

  ~CudaBackend() override {
    // The pool's blocks belong to the stream: the stream's work must be over
    // before they are freed, and the pool must go before the stream. If the
    // device does not finish in time, leak rather than block in cudaFree.
    // The destroying thread may not be bound to the device.
    (void)cudaSetDevice(device_);
    cudnn_attention_.reset();
    if (done_ != nullptr) {
      if (absl::Status s = Wait("destroying the backend"); !s.ok()) {
        spdlog::error("CUDA backend: {}; leaking its memory pool", s.message());
        (void)pool_.release();
      }
    }
    pool_.reset();
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  proto::Backend::Value kind() const override { return proto::Backend::cuda; }
  std::string Describe() const override {
    return absl::StrCat("cuda:", device_, " ", name_, " (bf16, ", comm_ == CommKind::kGloo ? "gloo" : "nccl",
                        "; attention: ", attention_line_, "; matmul glue: ",
                        epilogues_ ? "cuBLASLt epilogues" : "separate kernels", ")");
  }
  absl::Status BindThread() override { return cuda::CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); }
  model::DType activation_dtype() const override { return model::DType::kBF16; }
  BufferPool& pool() override { return *pool_; }
  StreamHandle stream() const override { return cuda::Handle(stream_); }

  absl::StatusOr<std::unique_ptr<model::Stage>> CreateStage(const model::GptConfig& config,
                                                            const model::StageOptions& options) override {
    model::CudaKernels kernels;
    kernels.matmul_epilogues = epilogues_;
    if (config.encoder_decoder) {  // T5's attention is its own kernel (cuda/t5_attention.h), not cuDNN's
      ASSIGN_OR_RETURN(std::unique_ptr<model::CudaT5Stage> stage,
                       model::CudaT5Stage::Create(config, options, stream_, pool_.get(), timeout_, kernels));
      return std::unique_ptr<model::Stage>(std::move(stage));
    }
    const int head_dim = config.heads > 0 ? config.hidden / config.heads : 0;
    if (cudnn_attention_ != nullptr &&
        std::find(cudnn_head_dims_.begin(), cudnn_head_dims_.end(), head_dim) != cudnn_head_dims_.end()) {
      kernels.cudnn_attention = cudnn_attention_.get();
    }
    ASSIGN_OR_RETURN(std::unique_ptr<model::CudaGptStage> stage,
                     model::CudaGptStage::Create(config, options, stream_, pool_.get(), timeout_, kernels));
    return std::unique_ptr<model::Stage>(std::move(stage));
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> Connect(const ConnectOptions& o,
                                                              comm::KeyValueStore* store) override {
    if (comm_ == CommKind::kGloo) {
      ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> host, ConnectGloo(o, store));
      comm::StagingCopies copies;
      copies.to_host = [this](void* h, const void* d, size_t bytes) { return CopyToHost(h, d, bytes); };
      copies.from_host = [this](void* d, const void* h, size_t bytes) { return CopyFromHost(d, h, bytes); };
      return comm::HostStaged(std::move(host), std::move(copies));
    }
    comm::NcclOptions n;
    n.rank = o.rank;
    n.size = o.size;
    n.job_prefix = o.job_prefix;
    n.device = device_;
    n.compute_stream = stream_;
    n.connect_timeout = o.connect_timeout;
    return comm::CreateNcclCommunicator(n, store);
  }

  // A copy to or from pageable host memory may block the host until the
  // stream reaches it (with no deadline), so the stream is drained first,
  // with one; the copy itself then waits on nothing else.
  absl::Status CopyToHost(void* host, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Wait("CopyToHost"));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    return Wait("CopyToHost");
  }
  absl::Status CopyFromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Wait("CopyFromHost"));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    return Wait("CopyFromHost");
  }
  absl::Status SumPair(float* a,  // (n) device
                       float* b,  // (n) device
                       size_t n) override {
    if (n == 0) return absl::OkStatus();
    RETURN_IF_ERROR(cuda::AddF32(a, a, b, static_cast<int64_t>(n), stream_));
    return cuda::CudaStatus(cudaMemcpyAsync(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                            "SumPair copy");
  }
  absl::Status Synchronize() override { return Wait("Synchronize"); }
  std::unique_ptr<InstructionTimer> NewTimer() override {
    return std::make_unique<CudaTimer>(&timing_events_, stream_, cuda::WaitSeconds(timeout_));
  }

 private:
  // The head dimensions the start-up check covers: GPT-350M's and GPT-1.3B's
  // (other dimensions run the tiled kernel).
  static constexpr int kCheckedHeadDims[] = {64, 128};

  // Decides which attention kernel runs (attention_choice.h): loads cuDNN,
  // checks it against the tiled kernel per head dimension, logs the outcome.
  absl::Status ChooseAttention(cuda::AttentionImpl requested) {
    cuda::CudnnFacts facts;
    facts.sm = sm_;
    const absl::StatusOr<const cuda::CudnnApi*> api = cuda::LoadCudnn();
    facts.loaded = api.status();
    if (api.ok()) facts.version = (*api)->version;
    if (requested != cuda::AttentionImpl::kTiled && cuda::CudnnPrerequisites(facts).ok()) {
      absl::StatusOr<std::unique_ptr<cuda::CudnnAttention>> att = cuda::CudnnAttention::Create(*api, stream_);
      for (const int hd : kCheckedHeadDims) {
        const absl::Status r = att.ok() ? cuda::ProbeCudnnAttention(**att, hd, stream_, cuda::WaitSeconds(timeout_))
                                        : att.status();
        facts.probes.push_back({hd, r});
      }
      if (att.ok()) cudnn_attention_ = std::move(*att);
    }
    ASSIGN_OR_RETURN(const cuda::AttentionDecision decision, cuda::DecideAttention(requested, facts));
    cudnn_head_dims_ = decision.cudnn_head_dims;
    if (cudnn_head_dims_.empty()) cudnn_attention_.reset();
    attention_line_ = decision.line;
    spdlog::info("cuda:{}: attention: {}{}", device_, attention_line_,
                 api.ok() ? absl::StrCat(" [cuDNN at ", (*api)->library_path, "]") : "");
    return absl::OkStatus();
  }

  // Waits for the work queued on the stream so far, with the deadline.
  absl::Status Wait(const char* what) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
    return cuda::WaitForEvent(done_, cuda::WaitSeconds(timeout_), what);
  }

  const int device_;
  const CommKind comm_;
  const absl::Duration timeout_;
  const std::string name_;
  const int sm_;
  const bool epilogues_;
  std::string attention_line_;
  std::vector<int> cudnn_head_dims_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention_;  // bound to stream_; null: tiled everywhere
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cuda::CudaAllocator allocator_;
  cuda::CudaEventFences fences_;
  std::unique_ptr<BufferPool> pool_;  // destroyed explicitly, before the stream
  TimingEvents timing_events_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    const std::string why = err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices";
    (void)cudaGetLastError();  // not sticky: clear it for later calls
    return absl::FailedPreconditionError(absl::StrCat("--backend cuda: no CUDA device is visible (", why, ")"));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("--device ", options.device, ": not a visible CUDA device (",
                                                      count, " visible: 0..", count - 1, ")"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  ASSIGN_OR_RETURN(const cuda::AttentionImpl attention, cuda::ParseAttentionImpl(options.attention_kernel));
  auto backend = std::make_unique<CudaBackend>(options, prop.name, prop.major * 10 + prop.minor);
  RETURN_IF_ERROR(backend->Init(attention));
  return std::unique_ptr<Backend>(std::move(backend));
}

namespace {

// CreateBackend finds the CUDA backend through this registration, made when
// a program links it (the library is alwayslink).
[[maybe_unused]] const bool registered = RegisterCudaBackend(&CreateCudaBackend);

}  // namespace

}  // namespace dynapipe::runtime
