#include "src/http/status_server.h"

#include <httplib.h>

#include <atomic>
#include <catch2/catch.hpp>

#include "src/http/metrics.h"

namespace dynapipe::http {
namespace {

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

}  // namespace
}  // namespace dynapipe::http
