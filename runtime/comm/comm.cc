#include "runtime/comm/comm.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace dynapipe::runtime::comm {
namespace {

constexpr absl::string_view kLostPeerUrl = "dynapipe/comm/lost_peer";

}  // namespace

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
