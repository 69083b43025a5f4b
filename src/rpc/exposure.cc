#include "src/rpc/exposure.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/logging.h"

ABSL_FLAG(bool, insecure, false,
          "serve without --token-file on addresses other than loopback (logs a warning; only for a network "
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

std::vector<std::string> SplitAddressList(absl::string_view addresses) {
  std::vector<std::string> out;
  for (absl::string_view a : absl::StrSplit(addresses, ',', absl::SkipEmpty())) out.emplace_back(a);
  return out;
}

absl::StatusOr<std::string> ChannelTarget(absl::string_view addresses) {
  const std::vector<std::string> list = SplitAddressList(addresses);
  if (list.size() == 1) return list[0];
  if (list.empty()) return absl::InvalidArgumentError("planner address: empty (give HOST:PORT)");
  int family = AF_UNSPEC;
  std::vector<std::string> resolved;
  for (const std::string& address : list) {
    const std::string host = HostOf(address);
    const size_t colon = address.rfind(':');
    if (host.size() == address.size() || colon == std::string::npos || colon + 1 == address.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("planner address list: \"", absl::CHexEscape(address), "\" has no port (give HOST:PORT,HOST:PORT)"));
    }
    const std::string port = address.substr(colon + 1);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("planner address list: cannot resolve ", absl::CHexEscape(address), ": ", ::gai_strerror(rc)));
    }
    char text[INET6_ADDRSTRLEN] = {};
    const int af = found->ai_family;
    const void* raw = af == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
                                     : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
    const bool ok = ::inet_ntop(af, raw, text, sizeof(text)) != nullptr;
    ::freeaddrinfo(found);
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("planner address list: cannot resolve ", address));
    if (family != AF_UNSPEC && af != family) {
      return absl::InvalidArgumentError("planner address list: mixes IPv4 and IPv6 planners (give one family)");
    }
    family = af;
    resolved.push_back(af == AF_INET6 ? absl::StrCat("[", text, "]:", port) : absl::StrCat(text, ":", port));
  }
  return absl::StrCat(family == AF_INET6 ? "ipv6:" : "ipv4:", absl::StrJoin(resolved, ","));
}

absl::StatusOr<std::string> LocalAddressToward(absl::string_view address_or_list) {
  const std::vector<std::string> list = SplitAddressList(address_or_list);
  const absl::string_view address = list.empty() ? address_or_list : absl::string_view(list[0]);
  std::string host = HostOf(address);
  std::string port = "9";  // any port: nothing is sent
  if (host.size() < address.size()) {
    const size_t colon = address.rfind(':');
    port = std::string(address.substr(colon + 1));
  }
  if (host == "localhost") host = "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address, ": ", ::gai_strerror(rc)));
  }
  std::string why = "no address";
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) out = text;
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (out.empty()) return absl::UnavailableError(absl::StrCat("no route to ", address, ": ", why));
  return out;
}

absl::Status RequireTokenOffLoopback(bool has_token, bool insecure, const std::vector<Exposure>& exposures) {
  if (has_token) return absl::OkStatus();
  for (const Exposure& e : exposures) {
    if (IsLoopbackHost(HostOf(e.address))) continue;
    const std::string where = absl::StrCat(e.flag, " ", e.address.empty() ? "\"\"" : e.address);
    if (!insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, " is not a loopback address and no --token-file is set: calls to and from other machines would be "
                 "unauthenticated; set --token-file (a 0600 file) or pass --insecure"));
    }
    spdlog::warn("INSECURE: {} is not a loopback address and no --token-file is set: calls to and from other "
                 "machines are unauthenticated; anyone who can reach this daemon can use it (--insecure)",
                 where);
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::rpc
