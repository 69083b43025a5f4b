#include "src/rpc/planner_client.h"

#include <catch2/catch.hpp>

namespace dynapipe::rpc {
namespace {

TEST_CASE("A planner address gRPC cannot resolve is refused at Connect, in one line") {
  for (const char* address : {"", " ", "host name:50051", "127.0.0.1:50051\n", "\x01:1"}) {
    INFO("address \"" << address << "\"");
    PlannerClient::Options o;
    o.address = address;
    auto c = PlannerClient::Connect(o);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(c.status().message().rfind("planner address: ", 0) == 0);
  }
  PlannerClient::Options o;
  o.address = "127.0.0.1:1";  // connecting is lazy: nothing listens there, Connect still succeeds
  CHECK(PlannerClient::Connect(o).ok());
}

}  // namespace
}  // namespace dynapipe::rpc
