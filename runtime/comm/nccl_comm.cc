#include "runtime/comm/nccl_comm.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/comm/nccl_core.h"
#include "runtime/device/cuda_status.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm {
namespace {

using nccl_internal::Core;
using nccl_internal::Direction;
using nccl_internal::Op;

class NcclRequest final : public Request {
 public:
  NcclRequest(std::shared_ptr<Core> core, std::shared_ptr<Op> op) : core_(std::move(core)), op_(std::move(op)) {}
  ~NcclRequest() override { core_->Drop(op_.get()); }
  absl::Status Wait(absl::Time deadline) override { return core_->Wait(op_.get(), deadline); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<Op> op_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~NcclCommunicator() override { core_->Shutdown(); }

  int rank() const override { return core_->options().rank; }
  int size() const override { return core_->options().size; }

  absl::StatusOr<std::unique_ptr<Request>> Send(int peer, uint64_t /*tag*/, const void* data,
                                                size_t bytes) override {
    ASSIGN_OR_RETURN(auto op, core_->StartP2P(Direction::kSend, peer, const_cast<void*>(data), bytes));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  absl::StatusOr<std::unique_ptr<Request>> Recv(int peer, uint64_t /*tag*/, void* data, size_t bytes) override {
    ASSIGN_OR_RETURN(auto op, core_->StartP2P(Direction::kRecv, peer, data, bytes));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  absl::Status GroupStart() override { return core_->GroupStart(); }
  absl::Status GroupEnd() override { return core_->GroupEnd(); }
  absl::Status AllReduceSum(absl::Span<const int> group, float* data, size_t n, absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, double* data, size_t n, absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  // Enqueued on the group's stream; the caller goes on while it runs.
  absl::StatusOr<std::unique_ptr<Request>> StartAllReduceSum(absl::Span<const int> group, float* data, size_t n,
                                                             absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto op, core_->StartAllReduce(group, data, n, deadline));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  bool overlaps_collectives() const override { return true; }
  absl::StatusOr<std::unique_ptr<Request>> StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                 absl::Span<const size_t> counts,
                                                                 absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto op, core_->StartSharded(group, data, counts, /*gather=*/false, deadline));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllGather(absl::Span<const int> group, float* data,
                                                          absl::Span<const size_t> counts,
                                                          absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto op, core_->StartSharded(group, data, counts, /*gather=*/true, deadline));
    return std::make_unique<NcclRequest>(core_, std::move(op));
  }
  void Abort() override { core_->Abort(absl::AbortedError("aborted by the caller")); }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

std::string HexEncode(const void* data, size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * bytes, '0');
  for (size_t i = 0; i < bytes; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

absl::Status HexDecode(absl::string_view hex, void* out, size_t bytes) {
  if (hex.size() != 2 * bytes) {
    return absl::DataLossError(absl::StrCat("hex id of ", hex.size(), " characters, expected ", 2 * bytes));
  }
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::DataLossError(absl::StrCat("hex id has a non-hex character at ", 2 * i));
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                     KeyValueStore* store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL rank ", options.rank, " of world size ", options.size));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return cuda::CudaStatus(e, absl::StrCat("cudaSetDevice(", options.device, ")"));
  }
  auto core = std::make_shared<Core>(options, store);
  RETURN_IF_ERROR(core->InitWorld());
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(core)));
}

}  // namespace dynapipe::runtime::comm
