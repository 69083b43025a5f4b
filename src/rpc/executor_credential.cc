#include "src/rpc/executor_credential.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace dynapipe::rpc {
namespace {

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> NewExecutorSecret() {
  auto bytes = RandomBytes(kExecutorSecretBytes);
  if (!bytes.ok()) return bytes.status();
  return absl::BytesToHexString(*bytes);
}

absl::StatusOr<std::string> RandomHex(int digits) {
  if (digits < 1 || digits > 16) return absl::InvalidArgumentError("digits: must be in 1..16");
  auto bytes = RandomBytes((digits + 1) / 2);
  if (!bytes.ok()) return bytes.status();
  return absl::BytesToHexString(*bytes).substr(0, digits);
}

std::string HashExecutorSecret(absl::string_view secret) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // SHA-256 cannot fail on a valid pointer and length.
  EVP_Digest(secret.data(), secret.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

bool ExecutorSecretMatches(absl::string_view secret, absl::string_view stored_sha256) {
  const std::string got = HashExecutorSecret(secret);
  return stored_sha256.size() == got.size() && CRYPTO_memcmp(got.data(), stored_sha256.data(), got.size()) == 0;
}

absl::Status MissingExecutorCredential() {
  return absl::UnauthenticatedError(absl::StrCat("missing executor credential: executor calls carry ",
                                                 kExecutorCredentialKey,
                                                 ": <executor id>:<secret> as returned by Register"));
}

std::string FormatExecutorCredential(const ExecutorCredential& credential) {
  return absl::StrCat(credential.executor_id, ":", credential.secret);
}

absl::StatusOr<ExecutorCredential> ParseExecutorCredential(absl::string_view value) {
  // The secret is hex, so the last ':' separates it from any id.
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::UnauthenticatedError(absl::StrCat(kExecutorCredentialKey, ": expected <executor id>:<secret>"));
  }
  ExecutorCredential c{std::string(value.substr(0, colon)), std::string(value.substr(colon + 1))};
  bool hex = c.secret.size() == 2 * kExecutorSecretBytes;
  for (char ch : c.secret) hex = hex && absl::ascii_isxdigit(static_cast<unsigned char>(ch));
  if (!hex) {
    return absl::UnauthenticatedError(absl::StrCat(kExecutorCredentialKey, ": the secret of executor ",
                                                   c.executor_id, " is not ", 2 * kExecutorSecretBytes,
                                                   " hex digits"));
  }
  return c;
}

}  // namespace dynapipe::rpc
