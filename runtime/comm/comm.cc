#include "runtime/comm/comm.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace dynapipe::runtime::comm {
namespace {

constexpr absl::string_view kLostPeerUrl = "dynapipe/comm/lost_peer";

// A collective that ran to completion before its Start returned.
class Completed final : public Request {
 public:
  absl::Status Wait(absl::Time) override { return absl::OkStatus(); }
};

}  // namespace

size_t ShardBegin(size_t n, int members, int index) {
  const size_t m = static_cast<size_t>(std::max(1, members)), i = static_cast<size_t>(std::max(0, index));
  return (n / m) * i + std::min(i, n % m);
}

absl::StatusOr<std::unique_ptr<Request>> Communicator::StartAllReduceSum(absl::Span<const int> group, float* data,
                                                                         size_t n, absl::Time deadline) {
  const absl::Status status = AllReduceSum(group, data, n, deadline);
  if (!status.ok()) return status;
  return std::unique_ptr<Request>(new Completed());
}

absl::StatusOr<std::unique_ptr<Request>> Communicator::StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                             absl::Span<const size_t> counts,
                                                                             absl::Time deadline) {
  size_t n = 0;
  for (size_t c : counts) n += c;
  return StartAllReduceSum(group, data, n, deadline);  // every member gets every shard's sum
}

absl::StatusOr<std::unique_ptr<Request>> Communicator::StartAllGather(absl::Span<const int>, float*,
                                                                      absl::Span<const size_t>, absl::Time) {
  return absl::UnimplementedError("all-gather: this communicator has none (ZeRO-1 needs Gloo on the cpu backend)");
}

absl::Status WithLostPeer(absl::Status status, int peer) {
  if (!status.ok()) status.SetPayload(kLostPeerUrl, absl::Cord(std::to_string(peer)));
  return status;
}

std::optional<int> LostPeer(const absl::Status& status) {
  const auto payload = status.GetPayload(kLostPeerUrl);  // absl::optional in this Abseil
  int peer;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &peer)) return std::nullopt;
  return peer;
}

}  // namespace dynapipe::runtime::comm
