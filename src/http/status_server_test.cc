#include "src/http/status_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <vector>

#include "absl/time/clock.h"

#include "src/http/metrics.h"
#include "src/testing/loopback.h"

namespace dynapipe::http {
namespace {

using testing::ConnectLoopback;

TEST_CASE("Status server serves health, status and metrics on a loopback port; read-only") {
  std::atomic<bool> healthy{true};
  Metrics metrics;
  metrics.Add("dynapipe_plans_total", 3, "Plans stored");
  metrics.Set("dynapipe_plans_ahead", 4);
  for (double v : {0.5, 3.0, 70.0}) metrics.Observe("dynapipe_plan_ms", v, {1, 10, 100}, "Plan latency");
  StatusServer::Options o;
  o.health = [&] { return healthy ? std::string() : std::string("redis unreachable"); };
  o.status = [] { return std::string(R"({"jobs":[]})"); };
  o.metrics = [&] { return metrics.Render(); };
  auto server = StatusServer::Start(o);
  REQUIRE(server.ok());
  httplib::Client client("127.0.0.1", (*server)->port());
  auto h = client.Get("/healthz");
  REQUIRE(h);
  CHECK(h->status == 200);
  healthy = false;
  h = client.Get("/healthz");
  CHECK(h->status == 503);
  CHECK(h->body.find("redis unreachable") != std::string::npos);
  CHECK(client.Get("/status")->body == R"({"jobs":[]})");
  const std::string text = client.Get("/metrics")->body;
  CHECK(text.find("# TYPE dynapipe_plans_total counter\ndynapipe_plans_total 3\n") != std::string::npos);
  CHECK(text.find("dynapipe_plan_ms_bucket{le=\"10\"} 2\n") != std::string::npos);
  CHECK(text.find("dynapipe_plan_ms_bucket{le=\"+Inf\"} 3\n") != std::string::npos);
  CHECK(text.find("dynapipe_plan_ms_count 3\n") != std::string::npos);
  CHECK(client.Post("/status", "x", "text/plain")->status == 405);
  CHECK(client.Get("/nope")->status == 404);
}

// Reads until the server closes the connection; true if it did so before `deadline`.
bool ClosedByServerBefore(int fd, absl::Time deadline) {
  char buf[512];
  while (absl::Now() < deadline) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;                                           // orderly close
    if (n < 0 && errno != EINTR) return errno == ECONNRESET;           // reset, or our recv timed out
  }
  return false;
}

TEST_CASE("Stalled clients cannot starve /healthz and are disconnected within the read timeout") {
  const StatusServer::Options o;  // the defaults every daemon runs with
  REQUIRE(o.read_timeout <= absl::Seconds(5));
  auto server = StatusServer::Start(o);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  // Half of them send half a request line and stall; half send nothing at all.
  std::vector<int> stalled;
  for (int i = 0; i < 16; ++i) {
    const int fd = ConnectLoopback(port, absl::Seconds(15));
    REQUIRE(fd >= 0);
    if (i % 2 == 0) REQUIRE(::send(fd, "GET /heal", 9, MSG_NOSIGNAL) == 9);
    stalled.push_back(fd);
  }
  const absl::Time stalled_at = absl::Now();
  absl::SleepFor(absl::Milliseconds(200));  // the server has taken them all on by now

  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(15);
  client.set_read_timeout(15);
  const absl::Time asked = absl::Now();
  auto h = client.Get("/healthz");
  const absl::Duration took = absl::Now() - asked;
  INFO("/healthz took " << absl::FormatDuration(took));
  REQUIRE(h);
  CHECK(h->status == 200);
  // Not queued behind a stalled client's timeout.
  CHECK(took < o.read_timeout);

  // Every stalled connection is closed by the server, soon after its timeout.
  const absl::Time deadline = stalled_at + std::max(o.read_timeout, o.keep_alive_timeout) + absl::Seconds(2);
  for (size_t i = 0; i < stalled.size(); ++i) {
    INFO("connection " << i << (i % 2 == 0 ? " (half a request line)" : " (silent)"));
    CHECK(ClosedByServerBefore(stalled[i], deadline));
    ::close(stalled[i]);
  }
  CHECK(client.Get("/healthz")->status == 200);
}

TEST_CASE("A second status server on a taken port fails to start instead of sharing it") {
  auto first = StatusServer::Start({});
  REQUIRE(first.ok());
  StatusServer::Options o;
  o.port = (*first)->port();
  auto second = StatusServer::Start(o);
  CHECK(second.status().code() == absl::StatusCode::kUnavailable);
  CHECK(second.status().message().find("127.0.0.1:" + std::to_string(o.port)) != std::string::npos);
  httplib::Client client("127.0.0.1", o.port);
  auto h = client.Get("/healthz");
  REQUIRE(h);
  CHECK(h->status == 200);
  // Once the first is gone the port is free again at once (SO_REUSEADDR),
  // even with the connection just served in TIME_WAIT.
  (*first)->Shutdown();
  first->reset();
  auto again = StatusServer::Start(o);
  INFO(again.status());
  CHECK(again.ok());
}

TEST_CASE("A status server shut down right after it starts does not hang") {
  for (int i = 0; i < 20; ++i) {
    auto s = StatusServer::Start({});
    REQUIRE(s.ok());
  }
}

}  // namespace
}  // namespace dynapipe::http
