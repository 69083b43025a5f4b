#pragma once

// Shared-token authentication for every gRPC call: clients send
// "authorization: Bearer <token>"; servers compare it in constant time.
// Optional TLS from certificate files.

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace dynapipe::rpc {

// The token from `file` (first line, trimmed); empty `file` means no token
// (authentication disabled). NOT_FOUND / INVALID_ARGUMENT name the file.
absl::StatusOr<std::string> ReadToken(const std::string& file);

// OK when `token` is empty (auth off) or the call carries it; otherwise
// UNAUTHENTICATED.
grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& token);

// Adds the bearer token to an outgoing call (no-op for an empty token).
void AttachToken(grpc::ClientContext* context, const std::string& token);

struct TlsFiles {
  std::string cert;  // PEM certificate chain (server) / unused (client)
  std::string key;   // PEM private key (server)
  std::string ca;    // PEM roots (client: to verify the server)
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address, const TlsFiles& tls);

}  // namespace dynapipe::rpc
