#include "runtime/model/profile_cuda.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/cast.h"
#include "runtime/device/cuda_status.h"
#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/model/gpt_cuda.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {
namespace {

using bf16 = __nv_bfloat16;

// Bounds every host wait for the device (a hung kernel, a lost device).
constexpr std::chrono::seconds kWaitTimeout = std::chrono::minutes(5);

// Everything the CUDA stages of one profile share: the stream, the device
// pool, and the events that time forward and backward.
struct Device {
  cudaStream_t stream = nullptr;
  cuda::CudaAllocator allocator;
  cuda::CudaEventFences fences;
  std::unique_ptr<BufferPool> pool;
  cudaEvent_t start = nullptr, mid = nullptr, end = nullptr;

  ~Device() {
    // The pool goes before the stream (its blocks belong to the stream), once
    // the stream's work is over; if it never ends, the pool is leaked rather
    // than freed under running kernels.
    if (stream != nullptr && end != nullptr && !Wait("profile teardown").ok()) (void)pool.release();
    pool.reset();
    for (cudaEvent_t e : {start, mid, end}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  absl::Status Init() {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    pool = std::make_unique<BufferPool>(&allocator, &fences);
    for (cudaEvent_t* e : {&start, &mid, &end}) CUDA_RETURN_IF_ERROR(cudaEventCreate(e));
    return absl::OkStatus();
  }
  // Waits for the work queued on the stream so far, with the deadline.
  absl::Status Wait(const char* what) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(end, stream));
    return cuda::WaitForEvent(end, kWaitTimeout, what);
  }
};

class CudaProfiledStage final : public ProfiledStage {
 public:
  static absl::StatusOr<std::unique_ptr<ProfiledStage>> Create(Device* device, const GptConfig& config,
                                                               const StageOptions& options) {
    auto self = std::unique_ptr<CudaProfiledStage>(new CudaProfiledStage(device));
    ASSIGN_OR_RETURN(self->stage_, CudaGptStage::Create(config, options, device->stream, device->pool.get()));
    return std::unique_ptr<ProfiledStage>(std::move(self));
  }
  double param_mb() const override { return static_cast<double>(stage_->num_params()) * sizeof(float) / 1e6; }

  absl::StatusOr<StageRun> Run(const TokenBatch& batch, std::mt19937_64& rng) override {
    const StageOptions& o = stage_->options();
    const int64_t hidden = stage_->HiddenElements(batch);
    const StreamHandle s = cuda::Handle(device_->stream);
    BufferPool& pool = *device_->pool;
    Buffer in, out, dout, din;
    if (!o.first) {
      ASSIGN_OR_RETURN(in, RandomBf16(hidden, 1.0f, rng));
    }
    if (!o.last) {
      ASSIGN_OR_RETURN(out, pool.Get(hidden * sizeof(bf16), s));
      ASSIGN_OR_RETURN(dout, RandomBf16(hidden, 1e-3f, rng));
    }
    if (!o.first) {
      ASSIGN_OR_RETURN(din, pool.Get(hidden * sizeof(bf16), s));
    }
    RETURN_IF_ERROR(stage_->ZeroGrads());
    RETURN_IF_ERROR(device_->Wait("profile staging"));  // staging done before timing
    const size_t base = pool.stats().in_use_bytes;
    pool.ResetPeak();
    CUDA_RETURN_IF_ERROR(cudaEventRecord(device_->start, device_->stream));
    RETURN_IF_ERROR(stage_->Forward(0, batch, in.data(), out.data(), 1.0f / static_cast<float>(batch.loss_tokens),
                                    Recompute::kNone));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(device_->mid, device_->stream));
    const size_t stored = pool.stats().in_use_bytes - base;
    RETURN_IF_ERROR(stage_->Backward(0, dout.data(), din.data()));
    RETURN_IF_ERROR(device_->Wait("profile run"));  // records `end`
    RETURN_IF_ERROR(stage_->TakeLoss().status());  // after the timing: the profile only needs the time
    float fw = 0, bw = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&fw, device_->start, device_->mid));
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&bw, device_->mid, device_->end));
    StageRun r;
    r.fw_ms = fw;
    r.bw_ms = bw;
    r.stored_activation_mb = stored / 1e6;
    r.peak_activation_mb =
        std::max<double>(0, static_cast<double>(pool.stats().peak_in_use_bytes - base) - stored) / 1e6;
    return r;
  }

 private:
  explicit CudaProfiledStage(Device* device) : device_(device) {}

  // n bf16 values N(0, std) on the device (staged through fp32).
  absl::StatusOr<Buffer> RandomBf16(int64_t n, float std, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, std);
    host_.resize(n);
    for (float& v : host_) v = normal(rng);
    const StreamHandle s = cuda::Handle(device_->stream);
    ASSIGN_OR_RETURN(Buffer f32, device_->pool->Get(n * sizeof(float), s));
    ASSIGN_OR_RETURN(Buffer out, device_->pool->Get(n * sizeof(bf16), s));
    // Staged at once from pageable memory: host_ may be reused on return.
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(f32.data(), host_.data(), n * sizeof(float), cudaMemcpyHostToDevice, device_->stream));
    RETURN_IF_ERROR(cuda::CastF32ToBf16(f32.as<float>(), out.as<uint16_t>(), n, device_->stream));
    return out;
  }

  Device* device_;
  std::unique_ptr<CudaGptStage> stage_;
  std::vector<float> host_;
};

}  // namespace

absl::StatusOr<proto::CostProfile> ProfileGptCuda(const GptConfig& config, const ProfileOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError("profile --device cuda: no CUDA device is visible");
  }
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, dev));
  Device device;
  RETURN_IF_ERROR(device.Init());
  return ProfileLayers(config, options, prop.name, [&](const GptConfig& c, const StageOptions& o) {
    return CudaProfiledStage::Create(&device, c, o);
  });
}

}  // namespace dynapipe::runtime::model
