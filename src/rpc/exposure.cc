#include "src/rpc/exposure.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "src/common/logging.h"

ABSL_FLAG(bool, insecure, false,
          "serve without --token_file on addresses other than loopback (logs a warning; only for a network "
          "nobody else can reach)");

namespace dynapipe::rpc {

bool IsLoopbackHost(absl::string_view host_arg) {
  const std::string host = absl::AsciiStrToLower(host_arg);
  if (host == "localhost" || host == "localhost.") return true;
  if (absl::StartsWith(host, "unix:") || absl::StartsWith(host, "unix-abstract:")) return true;
  in_addr v4;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) return std::string(address);
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) return std::string(address.substr(1, close - 1));
    return std::string(address);
  }
  const size_t colon = address.rfind(':');
  // More than one colon and no brackets: a bare IPv6 address.
  if (colon == absl::string_view::npos || address.find(':') != colon) return std::string(address);
  return std::string(address.substr(0, colon));
}

absl::Status RequireTokenOffLoopback(bool has_token, bool insecure, const std::vector<Exposure>& exposures) {
  if (has_token) return absl::OkStatus();
  for (const Exposure& e : exposures) {
    if (IsLoopbackHost(HostOf(e.address))) continue;
    const std::string where = absl::StrCat(e.flag, " ", e.address.empty() ? "\"\"" : e.address);
    if (!insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, " is not a loopback address and no --token_file is set: calls to and from other machines would be "
                 "unauthenticated; set --token_file (a 0600 file) or pass --insecure"));
    }
    spdlog::warn("INSECURE: {} is not a loopback address and no --token_file is set: calls to and from other "
                 "machines are unauthenticated; anyone who can reach this daemon can use it (--insecure)",
                 where);
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::rpc
