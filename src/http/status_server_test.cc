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
#include "src/testing/raw_socket.h"

namespace dynapipe::http {
namespace {

using testing::ConnectLoopback;
using testing::SendAndRead;

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
  CHECK(client.Head("/status")->status == 200);
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

// Sends `bytes` on a new connection, then reads until the server closes it
// (or 10 s pass): the whole reply.
std::string Exchange(int port, const std::string& bytes) {
  return SendAndRead(port, bytes, absl::Seconds(10), [](const std::string&) { return false; }).response;
}

TEST_CASE("Malformed request heads are refused with one status line each; pipelined requests are answered in order") {
  auto server = StatusServer::Start({});
  REQUIRE(server.ok());
  const int port = (*server)->port();
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1";
  CHECK(Exchange(port, get + "\r\nNoColonHere\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
  CHECK(Exchange(port, get + "\r\nX-A: a\rb\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
  std::string many = get;
  for (int i = 0; i < 10000; ++i) many += "\r\nX-H" + std::to_string(i) + ": v";
  CHECK(Exchange(port, many + "\r\n\r\n").rfind("HTTP/1.1 431 ", 0) == 0);
  CHECK(Exchange(port, "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03").rfind("HTTP/1.1 400 ", 0) == 0);
  CHECK(Exchange(port, "BREW /healthz HTTP/1.1\r\nHost: h\r\n\r\n").rfind("HTTP/1.1 501 ", 0) == 0);
  // A body the endpoint never reads: refused, and the client still gets the answer.
  const std::string post = "POST /healthz HTTP/1.1\r\nHost: h\r\nContent-Length: 1048576\r\n\r\n";
  const std::string refused = Exchange(port, post + std::string(1 << 20, 'x'));
  CHECK(refused.rfind("HTTP/1.1 405 ", 0) == 0);
  CHECK(refused.find("Allow: GET, HEAD\r\n") != std::string::npos);
  // Three requests in one write: three answers, the last closing.
  const std::string three = Exchange(port,
                                     "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"
                                     "HEAD /status HTTP/1.1\r\nHost: h\r\n\r\n"
                                     "GET /nope HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  const size_t first = three.find("HTTP/1.1 200 OK"), second = three.find("HTTP/1.1 200 OK", first + 1),
               third = three.find("HTTP/1.1 404 ");
  CHECK(first == 0);
  CHECK(second != std::string::npos);
  CHECK(third > second);
  CHECK(three.find("{}") == std::string::npos);  // HEAD: no body
  CHECK(three.find("Connection: close") > second);
  // The endpoint still answers.
  CHECK(Exchange(port, get + "\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 200 OK", 0) == 0);
}

TEST_CASE("A request head trickled a byte at a time is cut off at the read timeout") {
  StatusServer::Options o;
  o.read_timeout = absl::Milliseconds(500);
  auto server = StatusServer::Start(o);
  REQUIRE(server.ok());
  const int fd = ConnectLoopback((*server)->port(), absl::Seconds(10));
  REQUIRE(fd >= 0);
  const std::string slow = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + std::string(200, 'p');
  const absl::Time start = absl::Now();
  std::string reply;
  char buf[512];
  for (char c : slow) {
    if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;  // closed by the server
    absl::SleepFor(absl::Milliseconds(20));           // every byte well inside a per-read timeout
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) reply.append(buf, static_cast<size_t>(n));
    if (n == 0) break;
  }
  const absl::Duration took = absl::Now() - start;
  ::close(fd);
  INFO("cut off after " << absl::FormatDuration(took) << ", reply: " << reply);
  CHECK(reply.rfind("HTTP/1.1 408 ", 0) == 0);
  CHECK(took < absl::Seconds(3));  // the whole trickle would take about 5 s
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
