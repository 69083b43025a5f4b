#pragma once

// The one place where gRPC and absl statuses convert into each other.

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dynapipe::rpc {

grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

}  // namespace dynapipe::rpc
