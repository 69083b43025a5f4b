#include "src/http/status_server.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace dynapipe::http {

absl::StatusOr<std::unique_ptr<StatusServer>> StatusServer::Start(Options options) {
  std::unique_ptr<StatusServer> s(new StatusServer());
  s->server_ = std::make_unique<httplib::Server>();
  httplib::Server& srv = *s->server_;
  srv.Get("/healthz", [health = options.health](const httplib::Request&, httplib::Response& res) {
    const std::string why = health ? health() : "";
    res.status = why.empty() ? 200 : 503;
    res.set_content(why.empty() ? "ok\n" : "unhealthy: " + why + "\n", "text/plain");
  });
  srv.Get("/status", [status = options.status](const httplib::Request&, httplib::Response& res) {
    res.set_content(status ? status() : "{}", "application/json");
  });
  srv.Get("/metrics", [metrics = options.metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics ? metrics() : "", "text/plain; version=0.0.4");
  });
  for (const char* m : {"POST", "PUT", "DELETE", "PATCH"}) {
    auto reject = [](const httplib::Request&, httplib::Response& res) {
      res.status = 405;
      res.set_content("read-only endpoint\n", "text/plain");
    };
    if (std::string(m) == "POST") srv.Post(".*", reject);
    if (std::string(m) == "PUT") srv.Put(".*", reject);
    if (std::string(m) == "DELETE") srv.Delete(".*", reject);
    if (std::string(m) == "PATCH") srv.Patch(".*", reject);
  }
  if (options.port == 0) {
    s->port_ = srv.bind_to_any_port(options.host);
  } else {
    s->port_ = srv.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("status server: cannot bind ", options.host, ":", options.port));
  }
  s->thread_ = std::thread([&srv] { srv.listen_after_bind(); });
  return s;
}

void StatusServer::Shutdown() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

StatusServer::~StatusServer() { Shutdown(); }

}  // namespace dynapipe::http
