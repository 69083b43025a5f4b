#include "src/rpc/auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <algorithm>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"
#include "src/rpc/exposure.h"

namespace dynapipe::rpc {
namespace {

// OK when `got` (an "authorization" value, or null when the call has none)
// is "Bearer <token>"; compared in constant time.
grpc::Status MatchToken(const grpc::string_ref* got, const std::string& token) {
  if (got == nullptr) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing authorization token");
  const std::string expected = "Bearer " + token;
  unsigned diff = got->size() ^ expected.size();
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned>(i < got->size() ? got->data()[i] : 0) ^ expected[i];
  }
  if (diff != 0) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong authorization token");
  return grpc::Status::OK;
}

grpc::Status ToUnauthenticated(const absl::Status& s) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message()));
}

// The checks on a call's headers, before its message is read: the bearer
// token (unless `token` is empty), and for executor-only methods an executor
// credential of the right form. `get(key)` is the header's value or null.
template <typename Get>
grpc::Status CheckHeaders(const std::string& token, Get get) {
  if (!token.empty()) {
    if (grpc::Status s = MatchToken(get("authorization"), token); !s.ok()) return s;
  }
  const grpc::string_ref* path = get(":path");
  if (path == nullptr) return grpc::Status::OK;
  const absl::string_view method(path->data(), path->size());
  if (std::find(std::begin(kExecutorOnlyMethods), std::end(kExecutorOnlyMethods), method) ==
      std::end(kExecutorOnlyMethods)) {
    return grpc::Status::OK;
  }
  const grpc::string_ref* credential = get(kExecutorCredentialKey);
  if (credential == nullptr) return ToUnauthenticated(MissingExecutorCredential());
  const absl::StatusOr<ExecutorCredential> parsed =
      ParseExecutorCredential(absl::string_view(credential->data(), credential->size()));
  if (!parsed.ok()) return ToUnauthenticated(parsed.status());
  return grpc::Status::OK;
}

// CheckHeaders for TLS servers. Cheap, so it runs inline on the transport
// thread.
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*, OutputMetadata*) override {
    return CheckHeaders(token_, [&md](const char* key) -> const grpc::string_ref* {
      auto it = md.find(key);
      return it == md.end() ? nullptr : &it->second;
    });
  }

 private:
  std::string token_;
};

// The same checks for plaintext servers, through gRPC's core API: `state`
// is the token (a std::string the credentials own).
void ProcessTokenInCore(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                        grpc_process_auth_metadata_done_cb done, void* user_data) {
  grpc::string_ref found;
  const grpc::Status s =
      CheckHeaders(*static_cast<const std::string*>(state), [&](const char* key) -> const grpc::string_ref* {
        for (size_t i = 0; i < num_md; ++i) {
          if (grpc_slice_str_cmp(md[i].key, key) == 0) {
            found = grpc::string_ref(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                                     GRPC_SLICE_LENGTH(md[i].value));
            return &found;
          }
        }
        return nullptr;
      });
  done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(s.error_code()),
       s.ok() ? nullptr : s.error_message().c_str());
}

// Plaintext server credentials whose calls pass ProcessTokenInCore first.
// Overrides ServerCredentials' port hook, which grpc::Server calls.
class InsecureTokenCredentials final : public grpc::ServerCredentials {
 public:
  explicit InsecureTokenCredentials(std::string token) : token_(std::move(token)) {}
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    DP_CHECK_MSG(false, "InsecureTokenCredentials checks the token itself");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    grpc_server_credentials_set_auth_metadata_processor(
        creds, {ProcessTokenInCore, [](void* state) { delete static_cast<std::string*>(state); },
                new std::string(token_)});
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  std::string token_;
};

}  // namespace

absl::StatusOr<std::string> ReadToken(const std::string& file) {
  if (file.empty()) return std::string();
  ASSIGN_OR_RETURN(const std::string text, ReadSecretFile(file));
  // Blank lines and whitespace around the token are fine; inside it only
  // printable ASCII: gRPC refuses (aborts on) anything else in metadata. The
  // error names the byte, never the token.
  const absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(file, ": empty token file"));
  const size_t start = static_cast<size_t>(token.data() - text.data());
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c > ' ' && c < 0x7f) continue;
    std::string what;
    if (c == '\n' || c == '\r') {
      what = "a line break: the token must be one line";
    } else if (c == ' ' || c == '\t') {
      what = "white space inside the token";
    } else if (i == 0 && token.substr(0, 3) == "\xef\xbb\xbf") {
      what = "a UTF-8 byte order mark (save the file as plain ASCII)";
    } else {
      what = absl::StrFormat("byte 0x%02x, not printable ASCII", c);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": byte ", start + i, " is ", what, "; a token is printable ASCII (0x21-0x7e)"));
  }
  return std::string(token);
}

grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  return MatchToken(it == md.end() ? nullptr : &it->second, token);
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

absl::StatusOr<ExecutorCredential> CallerCredential(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find(kExecutorCredentialKey);
  if (it == md.end()) return ExecutorCredential();
  return ParseExecutorCredential(absl::string_view(it->second.data(), it->second.size()));
}

void AttachExecutorCredential(grpc::ClientContext* context, const ExecutorCredential& credential) {
  if (!credential.empty()) context->AddMetadata(kExecutorCredentialKey, FormatExecutorCredential(credential));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls,
                                                                           const std::string& token) {
  // Also without a token: the executor-only methods' header check runs.
  if (!tls.enabled()) return std::shared_ptr<grpc::ServerCredentials>(std::make_shared<InsecureTokenCredentials>(token));
  grpc::SslServerCredentialsOptions options;
  ASSIGN_OR_RETURN(const std::string cert, ReadFile(tls.cert));
  ASSIGN_OR_RETURN(const std::string key, ReadSecretFile(tls.key));
  options.pem_key_cert_pairs.push_back({key, cert});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  creds->SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(token));
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address, const TlsFiles& tls) {
  // gRPC would take these and log resolver errors on every call attempt.
  if (address.empty()) return absl::InvalidArgumentError("planner address: empty (give HOST:PORT)");
  for (unsigned char c : address) {
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError("planner address: contains a space or a non-printable byte (give HOST:PORT)");
    }
  }
  grpc::ChannelArguments args;
  // A restarted planner is reached within about a second: gRPC's default
  // reconnect backoff grows to 120 s, which kept executors away from a
  // planner already serving again.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(kMaxPlannerResponseBytes);
  args.SetMaxSendMessageSize(kMaxPlannerRequestBytes);
  ASSIGN_OR_RETURN(const std::string target, ChannelTarget(address));
  if (!tls.enabled()) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadFile(tls.ca));
  // Planners in a list are checked against the first one's name: give them
  // one certificate that names it (and the others, as alternative names).
  if (target != address) args.SetSslTargetNameOverride(HostOf(SplitAddressList(address)[0]));
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(options), args);
}

}  // namespace dynapipe::rpc
