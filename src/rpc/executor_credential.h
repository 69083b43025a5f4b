#pragma once

// Per-executor identity. Register hands each executor a random secret; the
// planner keeps only its SHA-256 (ExecutorRecord.secret_sha256). On every
// executor-side call (Heartbeat, ReportIteration, FetchPlan, Bootstrap
// Set/Get) the executor sends the gRPC metadata
//
//   x-dynapipe-executor: <executor id>:<secret as 64 lower-case hex digits>
//
// beside the shared bearer token, which stays the outer gate for every call.
// No gRPC types here: the planner's handlers use it too.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynapipe::rpc {

// The metadata key (gRPC keys are lower case).
inline constexpr char kExecutorCredentialKey[] = "x-dynapipe-executor";
// Random bytes in a secret (256 bits).
inline constexpr int kExecutorSecretBytes = 32;

struct ExecutorCredential {
  std::string executor_id;
  std::string secret;  // hex; empty: no credential
  bool empty() const { return executor_id.empty() && secret.empty(); }
};

// A fresh secret from the kernel's CSPRNG (getrandom), hex-encoded.
// UNAVAILABLE if the kernel cannot supply random bytes.
absl::StatusOr<std::string> NewExecutorSecret();

// Up to 16 random hex digits from the same CSPRNG, for identifiers that must
// not be guessable or collide (executor ids).
absl::StatusOr<std::string> RandomHex(int digits);

// SHA-256 of the secret's text (raw 32 bytes): what the store keeps.
std::string HashExecutorSecret(absl::string_view secret);

// True if `secret` hashes to `stored_sha256` (constant-time comparison).
bool ExecutorSecretMatches(absl::string_view secret, absl::string_view stored_sha256);

// The refusal of an executor-only call without a credential.
absl::Status MissingExecutorCredential();

// "<id>:<secret>", the metadata value.
std::string FormatExecutorCredential(const ExecutorCredential& credential);

// Parses a metadata value; UNAUTHENTICATED naming the problem when it is not
// "<id>:<64 hex digits>".
absl::StatusOr<ExecutorCredential> ParseExecutorCredential(absl::string_view value);

}  // namespace dynapipe::rpc
