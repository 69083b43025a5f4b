// The test Redis server is real: a hiredis client can use it, it can be
// stopped (clients then fail fast, not hang) and brought back.
#include <hiredis/hiredis.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "src/testing/redis_server.h"

namespace dynapipe::testing {
namespace {

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

Context Connect(int port) {
  timeval tv{1, 0};
  return Context(redisConnectWithTimeout("127.0.0.1", port, tv));
}

std::string Command(redisContext* c, const char* fmt, const char* a = nullptr, const char* b = nullptr) {
  auto* reply = static_cast<redisReply*>(redisCommand(c, fmt, a, b));
  if (reply == nullptr) return "<error>";
  std::string out = reply->str != nullptr ? std::string(reply->str, reply->len) : "";
  freeReplyObject(reply);
  return out;
}

TEST_CASE("A test Redis server starts on a loopback port and serves commands") {
  auto server = RedisServer::Start();
  REQUIRE(server.ok());
  RedisServer& redis = **server;
  CHECK(redis.port() > 0);
  Context c = Connect(redis.port());
  REQUIRE(c != nullptr);
  REQUIRE(c->err == 0);
  CHECK(Command(c.get(), "SET %s %s", "dynapipe:test", "42") == "OK");
  CHECK(Command(c.get(), "GET %s", "dynapipe:test") == "42");

  redis.Stop();
  CHECK_FALSE(redis.running());
  CHECK_FALSE(RedisAnswersPing(redis.port(), absl::Milliseconds(200)));
  Context refused = Connect(redis.port());
  REQUIRE(refused != nullptr);
  CHECK(refused->err != 0);

  REQUIRE(redis.Restart().ok());
  Context again = Connect(redis.port());
  REQUIRE(again->err == 0);
  CHECK(Command(again.get(), "GET %s", "dynapipe:test").empty());  // no persistence
}

TEST_CASE("Two test servers get different ports") {
  auto a = RedisServer::Start();
  auto b = RedisServer::Start();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)->port() != (*b)->port());
}

}  // namespace
}  // namespace dynapipe::testing

namespace dynapipe::testing {
namespace {

TEST_CASE("A persistent test Redis keeps its data across a stop and restart") {
  auto server = RedisServer::Start(absl::Seconds(10), /*persistent=*/true);
  REQUIRE(server.ok());
  Context c = Connect((*server)->port());
  REQUIRE(c->err == 0);
  CHECK(Command(c.get(), "SET %s %s", "kept", "yes") == "OK");
  (*server)->Stop();
  CHECK_FALSE(RedisAnswersPing((*server)->port(), absl::Milliseconds(200)));
  REQUIRE((*server)->Restart().ok());
  Context again = Connect((*server)->port());
  CHECK(Command(again.get(), "GET %s", "kept") == "yes");
}

}  // namespace
}  // namespace dynapipe::testing
