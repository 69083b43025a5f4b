#include "runtime/comm/staged_comm.h"

#include <vector>

#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm {
namespace {

class StagedRequest final : public Request {
 public:
  // `device` is null for sends (nothing comes back).
  StagedRequest(std::unique_ptr<Request> inner, std::vector<char> staging, void* device,
                std::shared_ptr<const StagingCopies> copies)
      : staging_(std::move(staging)), inner_(std::move(inner)), device_(device), copies_(std::move(copies)) {}
  // The host transfer goes first (aborting it if unfinished): it may still
  // write into the staging buffer.
  ~StagedRequest() override { inner_.reset(); }

  absl::Status Wait(absl::Time deadline) override {
    if (done_) return result_;
    result_ = inner_->Wait(deadline);
    if (result_.ok() && device_ != nullptr) result_ = copies_->from_host(device_, staging_.data(), staging_.size());
    done_ = true;
    return result_;
  }

 private:
  std::vector<char> staging_;
  std::unique_ptr<Request> inner_;  // uses staging_
  void* device_;
  std::shared_ptr<const StagingCopies> copies_;  // requests may outlive their communicator
  bool done_ = false;
  absl::Status result_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, StagingCopies copies)
      : host_(std::move(host)), copies_(std::make_shared<const StagingCopies>(std::move(copies))) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  absl::StatusOr<std::unique_ptr<Request>> Send(int peer, uint64_t tag, const void* data, size_t bytes) override {
    std::vector<char> staging(bytes);
    RETURN_IF_ERROR(copies_->to_host(staging.data(), data, bytes));
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner, host_->Send(peer, tag, staging.data(), bytes));
    return std::unique_ptr<Request>(new StagedRequest(std::move(inner), std::move(staging), nullptr, copies_));
  }

  absl::StatusOr<std::unique_ptr<Request>> Recv(int peer, uint64_t tag, void* data, size_t bytes) override {
    std::vector<char> staging(bytes);
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner, host_->Recv(peer, tag, staging.data(), bytes));
    return std::unique_ptr<Request>(new StagedRequest(std::move(inner), std::move(staging), data, copies_));
  }

  absl::Status GroupStart() override { return host_->GroupStart(); }
  absl::Status GroupEnd() override { return host_->GroupEnd(); }

  absl::Status AllReduceSum(absl::Span<const int> group, float* data, size_t n, absl::Time deadline) override {
    return Reduce(group, data, n, deadline);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, double* data, size_t n, absl::Time deadline) override {
    return Reduce(group, data, n, deadline);
  }

  // The sharded collectives of ZeRO-1 through the host: the device data is
  // copied out now (after the work queued on the device), the host
  // communicator runs the collective, and Wait copies the result back (all
  // of it: outside a reduce-scatter's own shard the contract leaves data
  // unspecified).
  absl::StatusOr<std::unique_ptr<Request>> StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                 absl::Span<const size_t> counts,
                                                                 absl::Time deadline) override {
    return StartSharded(group, data, counts, deadline, /*gather=*/false);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllGather(absl::Span<const int> group, float* data,
                                                          absl::Span<const size_t> counts,
                                                          absl::Time deadline) override {
    return StartSharded(group, data, counts, deadline, /*gather=*/true);
  }

  void Abort() override { host_->Abort(); }

 private:
  absl::StatusOr<std::unique_ptr<Request>> StartSharded(absl::Span<const int> group, float* data,
                                                        absl::Span<const size_t> counts, absl::Time deadline,
                                                        bool gather) {
    size_t n = 0;
    for (size_t c : counts) n += c;
    std::vector<char> staging(n * sizeof(float));
    RETURN_IF_ERROR(copies_->to_host(staging.data(), data, staging.size()));
    auto* host = reinterpret_cast<float*>(staging.data());
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner, gather ? host_->StartAllGather(group, host, counts, deadline)
                                                            : host_->StartReduceScatterSum(group, host, counts, deadline));
    return std::unique_ptr<Request>(new StagedRequest(std::move(inner), std::move(staging), data, copies_));
  }

  template <typename T>
  absl::Status Reduce(absl::Span<const int> group, T* data, size_t n, absl::Time deadline) {
    std::vector<T> staging(n);
    RETURN_IF_ERROR(copies_->to_host(staging.data(), data, n * sizeof(T)));
    RETURN_IF_ERROR(host_->AllReduceSum(group, staging.data(), n, deadline));
    return copies_->from_host(data, staging.data(), n * sizeof(T));
  }

  std::unique_ptr<Communicator> host_;
  std::shared_ptr<const StagingCopies> copies_;
};

}  // namespace

std::unique_ptr<Communicator> HostStaged(std::unique_ptr<Communicator> host, StagingCopies copies) {
  return std::make_unique<StagedCommunicator>(std::move(host), std::move(copies));
}

}  // namespace dynapipe::runtime::comm
