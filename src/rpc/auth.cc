#include "src/rpc/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::rpc {

absl::StatusOr<std::string> ReadToken(const std::string& file) {
  if (file.empty()) return std::string();
  ASSIGN_OR_RETURN(const std::string text, ReadFile(file));
  std::string token(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(file, ": empty token file"));
  return token;
}

grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing authorization token");
  const std::string expected = "Bearer " + token;
  const grpc::string_ref got = it->second;
  // Constant-time comparison.
  unsigned diff = got.size() ^ expected.size();
  for (size_t i = 0; i < expected.size(); ++i) diff |= static_cast<unsigned>(i < got.size() ? got.data()[i] : 0) ^ expected[i];
  if (diff != 0) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong authorization token");
  return grpc::Status::OK;
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  ASSIGN_OR_RETURN(const std::string cert, ReadFile(tls.cert));
  ASSIGN_OR_RETURN(const std::string key, ReadFile(tls.key));
  options.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address, const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadFile(tls.ca));
  return grpc::CreateChannel(address, grpc::SslCredentials(options));
}

}  // namespace dynapipe::rpc
