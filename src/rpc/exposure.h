#pragma once

// One rule for every daemon: without a token it serves only this machine.
// An address other than loopback (a --listen, --http-host or peer address
// other machines can reach, or a remote planner called without a token) is
// refused with one line naming the flag, unless the operator passes
// --insecure, which logs a loud warning per such address instead.

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// Defined once here for dynapipe-planner and dynapipe-executor; read only in
// their main().
ABSL_DECLARE_FLAG(bool, insecure);

namespace dynapipe::rpc {

// True for hosts only this machine can reach: 127.0.0.0/8, ::1 (also
// v4-mapped), "localhost" and unix sockets ("unix:..."). Everything else is
// not, including "", 0.0.0.0 and :: (every interface) and other host names.
bool IsLoopbackHost(absl::string_view host);

// The host of "host:port" or "[v6]:port"; a string without a port (a bare
// host, "::1", "unix:/path") is returned whole.
std::string HostOf(absl::string_view address);

// The addresses of a comma-separated list ("a:50051,b:50051"), in order;
// empty elements are dropped. A single address is a list of one.
std::vector<std::string> SplitAddressList(absl::string_view addresses);

// The gRPC target for a planner address or list. One address is passed
// through (gRPC resolves it by DNS and re-resolves on reconnect). A list of
// planners sharing one Redis becomes "ipv4:A:P,B:P" (or ipv6:) with each
// name resolved now: gRPC's pick_first then connects to the first that
// answers, and to the next when that one goes away. INVALID_ARGUMENT naming
// the element that has no port, does not resolve, or mixes address families.
absl::StatusOr<std::string> ChannelTarget(absl::string_view addresses);

// The local address this machine uses to reach `address` ("host:port"): the
// source address the kernel picks for a route to it (a UDP socket is
// connected, no packet is sent). What peers on that network can reach this
// machine at; 127.0.0.1 for a loopback target. For a list, its first address. UNAVAILABLE naming the
// address when it cannot be resolved or has no route.
absl::StatusOr<std::string> LocalAddressToward(absl::string_view address);

// An address a daemon serves on or sends its calls to, and the flag that set it.
struct Exposure {
  std::string flag;     // "--listen"
  std::string address;  // "0.0.0.0:50051", or a bare host ("0.0.0.0")
};

// OK when `has_token` or every exposure is loopback. Otherwise
// FAILED_PRECONDITION naming the first exposure off loopback and the fix,
// unless `insecure`: then a warning per such exposure is logged and OK returned.
absl::Status RequireTokenOffLoopback(bool has_token, bool insecure, const std::vector<Exposure>& exposures);

}  // namespace dynapipe::rpc
