#include "runtime/backend/cpu_backend.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/attention_choice.h"
#include "runtime/comm/gloo_comm.h"
#include "runtime/model/gpt.h"
#include "runtime/model/t5.h"
#include "src/common/logging.h"

namespace dynapipe::runtime {
namespace {

using Clock = std::chrono::steady_clock;

class HostTimer final : public InstructionTimer {
 public:
  absl::Status Begin(int index) override {
    const Clock::time_point now = Clock::now();
    if (marks_.empty()) origin_ = now;
    proto::InstructionTiming t;
    t.set_index(index);
    t.set_start_ms(Ms(now));
    marks_.push_back(std::move(t));
    return absl::OkStatus();
  }
  absl::Status End(int index) override {
    if (marks_.empty() || marks_.back().index() != index) {
      return absl::InternalError(absl::StrCat("timer: End(", index, ") without its Begin"));
    }
    marks_.back().set_end_ms(Ms(Clock::now()));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<proto::InstructionTiming>> Finish() override { return std::move(marks_); }

 private:
  double Ms(Clock::time_point t) const { return std::chrono::duration<double, std::milli>(t - origin_).count(); }
  Clock::time_point origin_;
  std::vector<proto::InstructionTiming> marks_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : budget_(CpuAllocator()), pool_(&budget_) {}
  proto::Backend::Value kind() const override { return proto::Backend::cpu; }
  std::string Describe() const override { return "cpu (fp32, Gloo)"; }
  absl::Status BindThread() override { return absl::OkStatus(); }
  model::DType activation_dtype() const override { return model::DType::kF32; }
  BufferPool& pool() override { return pool_; }
  StreamHandle stream() const override { return 0; }

  absl::StatusOr<std::unique_ptr<model::Stage>> CreateStage(const model::GptConfig& config,
                                                            const model::StageOptions& options) override {
    if (config.encoder_decoder) {
      auto t5 = model::T5Stage::Create(config, options, &pool_);
      if (!t5.ok()) return t5.status();
      return std::unique_ptr<model::Stage>(std::move(*t5));
    }
    auto stage = model::GptStage::Create(config, options, &pool_);
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<model::Stage>(std::move(*stage));
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> Connect(const ConnectOptions& o,
                                                              comm::KeyValueStore* store) override {
    return ConnectGloo(o, store);
  }

  absl::Status CopyToHost(void* host, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  absl::Status SumPair(float* a, float* b, size_t n) override {
    for (size_t i = 0; i < n; ++i) b[i] = a[i] += b[i];
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  std::unique_ptr<InstructionTimer> NewTimer() override { return NewHostTimer(); }
  void LimitMemory(size_t bytes, std::string what) override {
    // Blocks cached from an earlier job must not count against this one.
    if (absl::Status s = pool_.Trim(); !s.ok()) spdlog::warn("returning cached buffers: {}", s.message());
    budget_.SetBudget(bytes, std::move(what));
  }

 private:
  BudgetAllocator budget_;  // before pool_, which returns its blocks to it
  BufferPool pool_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectGloo(const ConnectOptions& o,
                                                                comm::KeyValueStore* store) {
  comm::GlooOptions g;
  g.rank = o.rank;
  g.size = o.size;
  g.job_prefix = o.job_prefix;
  g.interface_address = o.listen_address;
  g.connect_timeout = o.connect_timeout;
  return comm::CreateGlooCommunicator(g, store);
}

std::unique_ptr<InstructionTimer> NewHostTimer() { return std::make_unique<HostTimer>(); }

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  if (options.comm == CommKind::kNccl) {
    return absl::FailedPreconditionError("--comm nccl: NCCL needs --backend cuda (the cpu backend uses Gloo)");
  }
  absl::StatusOr<cuda::AttentionImpl> attention = cuda::ParseAttentionImpl(options.attention_kernel);
  if (!attention.ok()) return attention.status();
  if (*attention == cuda::AttentionImpl::kCudnn) {
    return absl::FailedPreconditionError("--attention-kernel cudnn: cuDNN needs --backend cuda");
  }
  return std::unique_ptr<Backend>(new CpuBackend());
}

}  // namespace dynapipe::runtime
