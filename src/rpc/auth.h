#pragma once

// Shared-token authentication for every gRPC call: clients send
// "authorization: Bearer <token>"; servers compare it in constant time, on
// the call's headers before its message is read (ServerCredentials) and
// again in the handlers. Executors add their own identity
// (executor_credential.h). Optional TLS from certificate files. Message size
// limits of the planner's channel, declared once for both ends.

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "src/rpc/executor_credential.h"

namespace dynapipe::rpc {

// Largest message the planner receives. The largest legitimate request is
// an IterationReport, which carries one InstructionTiming (~25 bytes) per
// instruction of the rank's plan: a 16-stage x 4-way GPT job on 64K-token
// batches reports under 4 KB per rank (tests/integration/identity_test.cc
// checks it stays under 1/64 of this limit; executors drop the timings of a
// report that would pass half of it). Job specs (src/spec: names <= 256
// bytes, paths <= 4 KB, <= 4096 layer placements) stay under ~40 KB;
// registrations, heartbeats and bootstrap values (an NCCL id, Gloo
// addresses) are smaller still.
inline constexpr int kMaxPlannerRequestBytes = 4 << 20;
// Memory the planner's gRPC transport may hold for incoming bytes, all calls
// together: room for 16 requests of the largest size in flight. gRPC 1.51
// checks a message's size only once it has arrived whole; this quota is what
// keeps a token holder's 300 MB message from being buffered (the transport
// resets such a stream when the quota runs out).
inline constexpr int kPlannerReceiveQuotaBytes = 16 * kMaxPlannerRequestBytes;
// Largest message the planner sends: execution plans (planner -> executor),
// job listings. The planner's send limit and its clients' receive limit.
inline constexpr int kMaxPlannerResponseBytes = 256 << 20;

// The token from `file`: its one line of printable ASCII, blank lines and
// surrounding white space ignored; empty `file` means no token
// (authentication disabled). NOT_FOUND / INVALID_ARGUMENT name the file (and
// the offending byte's offset, never the token); FAILED_PRECONDITION when
// others may read it (ReadSecretFile).
absl::StatusOr<std::string> ReadToken(const std::string& file);

// The methods only executors call (gRPC ":path" values). Their calls must
// carry a well-formed executor credential (x-dynapipe-executor) on their
// headers: ServerCredentials refuses one without it before its message is
// read; the secret itself is checked against the store by the handler.
inline constexpr const char* kExecutorOnlyMethods[] = {
    "/dynapipe.proto.PlanService/ReportIteration",
    "/dynapipe.proto.ExecutorRegistry/Heartbeat",
    "/dynapipe.proto.Bootstrap/Set",
    "/dynapipe.proto.Bootstrap/Get",
};

// OK when `token` is empty (auth off) or the call carries it; otherwise
// UNAUTHENTICATED.
grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& token);

// Adds the bearer token to an outgoing call (no-op for an empty token).
void AttachToken(grpc::ClientContext* context, const std::string& token);

// The executor credential the call carries (empty if none);
// UNAUTHENTICATED if the metadata is malformed.
absl::StatusOr<ExecutorCredential> CallerCredential(const grpc::ServerContextBase& context);

// Adds the executor credential to an outgoing call (no-op when empty).
void AttachExecutorCredential(grpc::ClientContext* context, const ExecutorCredential& credential);

struct TlsFiles {
  std::string cert;  // PEM certificate chain (server) / unused (client)
  std::string key;   // PEM private key (server)
  std::string ca;    // PEM roots (client: to verify the server)
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

// Server credentials (TLS if `tls` is enabled) that refuse a call as soon as
// its headers arrive, before its message is received, when `token` is set
// and the call lacks it, or when it calls an executor-only method without a
// well-formed executor credential. (gRPC 1.51 applies the receive-size limit
// only once the whole message has arrived, so the limit alone does not stop
// a 200 MB body from being buffered; the planner's receive quota bounds what
// a token holder can make it buffer.) TLS servers get an
// AuthMetadataProcessor; plaintext servers the same check through gRPC's
// core API, since the C++ InsecureServerCredentials aborts on
// SetAuthMetadataProcessor.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls,
                                                                           const std::string& token);
// A channel to the planner with the size limits above.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address, const TlsFiles& tls);

}  // namespace dynapipe::rpc
