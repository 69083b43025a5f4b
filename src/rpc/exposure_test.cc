#include "src/rpc/exposure.h"

#include <catch2/catch.hpp>

namespace dynapipe::rpc {
namespace {

TEST_CASE("IsLoopbackHost: only addresses this machine alone can reach") {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1", "::ffff:127.0.0.1", "unix:/tmp/s"}) {
    INFO(h);
    CHECK(IsLoopbackHost(h));
  }
  for (const char* h : {"0.0.0.0", "::", "", "10.0.0.1", "128.0.0.1", "planner-host", "localhost.example.com",
                        "::ffff:10.0.0.1", "127.0.0.1.example.com"}) {
    INFO(h);
    CHECK_FALSE(IsLoopbackHost(h));
  }
}

TEST_CASE("HostOf takes the host out of host:port, [v6]:port and bare hosts") {
  CHECK(HostOf("127.0.0.1:50051") == "127.0.0.1");
  CHECK(HostOf("0.0.0.0:0") == "0.0.0.0");
  CHECK(HostOf("[::1]:50051") == "::1");
  CHECK(HostOf("[::]:50051") == "::");
  CHECK(HostOf("::1") == "::1");
  CHECK(HostOf("node-7") == "node-7");
  CHECK(HostOf(":50051") == "");
  CHECK(HostOf("unix:/run/dynapipe.sock") == "unix:/run/dynapipe.sock");
}

TEST_CASE("Without a token, an address off loopback is refused naming its flag, unless --insecure") {
  const std::vector<Exposure> loopback = {{"--listen", "127.0.0.1:50051"}, {"--http-host", "localhost"}};
  CHECK(RequireTokenOffLoopback(false, false, loopback).ok());
  const std::vector<Exposure> open = {{"--listen", "127.0.0.1:50051"}, {"--http-host", "0.0.0.0"}};
  const absl::Status refused = RequireTokenOffLoopback(false, false, open);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  const std::string msg(refused.message());
  CHECK(msg.rfind("--http-host 0.0.0.0 is not a loopback address", 0) == 0);
  CHECK(msg.find("--token-file") != std::string::npos);
  CHECK(msg.find("--insecure") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  const absl::Status no_host = RequireTokenOffLoopback(false, false, {{"--listen", ":50051"}});
  CHECK(no_host.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(RequireTokenOffLoopback(false, true, open).ok());  // --insecure: a warning, not a refusal
  CHECK(RequireTokenOffLoopback(true, false, open).ok());  // a token: anything goes
}

TEST_CASE("LocalAddressToward: the source address of the route to a target") {
  CHECK(*LocalAddressToward("127.0.0.1:50051") == "127.0.0.1");
  CHECK(*LocalAddressToward("localhost:50051") == "127.0.0.1");
  const auto bad = LocalAddressToward("no-such-host.invalid:50051");
  CHECK(bad.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(bad.status().message()).find("no-such-host.invalid:50051") != std::string::npos);
  CHECK(*LocalAddressToward("127.0.0.1:50051,192.0.2.1:50051") == "127.0.0.1");  // a list: its first
}

TEST_CASE("A list of planners becomes one resolved gRPC target; a single address passes through") {
  CHECK(SplitAddressList("a:1,,b:2") == std::vector<std::string>{"a:1", "b:2"});
  CHECK(*ChannelTarget("planner-host:50051") == "planner-host:50051");
  CHECK(*ChannelTarget("127.0.0.1:50051,localhost:50052") == "ipv4:127.0.0.1:50051,127.0.0.1:50052");
  CHECK(*ChannelTarget("[::1]:1,[::1]:2") == "ipv6:[::1]:1,[::1]:2");
  const auto no_port = ChannelTarget("127.0.0.1:1,127.0.0.2");
  CHECK(no_port.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(no_port.status().message()).find("\"127.0.0.2\" has no port") != std::string::npos);
  CHECK(ChannelTarget("127.0.0.1:1,no-such-host.invalid:2").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(ChannelTarget("127.0.0.1:1,[::1]:2").status().message()).find("mixes IPv4 and IPv6") !=
        std::string::npos);
  CHECK(ChannelTarget(",").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dynapipe::rpc
