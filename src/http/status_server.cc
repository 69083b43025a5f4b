#include "src/http/status_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/mutex.h"

namespace dynapipe::http {
namespace {

// httplib's task queue with a fixed number of workers and a bounded queue:
// when the queue is full, enqueue (called by the accept loop) waits for a
// free slot, so connections beyond it wait in the kernel's backlog instead of
// piling up here. (httplib's own pool has max(8, cores - 1) workers and an
// unbounded queue.)
class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(int workers, size_t max_queued) : max_queued_(std::max<size_t>(1, max_queued)) {
    for (int i = 0; i < std::max(1, workers); ++i) threads_.emplace_back([this] { Work(); });
  }
  ~BoundedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return queue_.size() < max_queued_ || shutdown_; });
    queue_.push_back(std::move(fn));
  }

  // Runs what is queued, then joins the workers.
  void shutdown() override {
    {
      MutexLock lock(&mu_);
      shutdown_ = true;
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty() || shutdown_; });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::vector<std::thread> threads_;
  Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

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
  // Slow clients: bounded waits everywhere, and our own pool of workers.
  srv.set_read_timeout(absl::ToChronoMicroseconds(options.read_timeout));
  srv.set_write_timeout(absl::ToChronoMicroseconds(options.write_timeout));
  const absl::Duration keep_alive = absl::Ceil(options.keep_alive_timeout, absl::Seconds(1));  // whole seconds only
  srv.set_keep_alive_timeout(std::max<time_t>(1, absl::ToInt64Seconds(keep_alive)));
  srv.set_keep_alive_max_count(static_cast<size_t>(std::max(1, options.keep_alive_max_requests)));
  srv.set_payload_max_length(64 << 10);  // a read-only endpoint takes no bodies
  srv.new_task_queue = [workers = options.workers, queued = options.max_queued_connections] {
    return new BoundedPool(workers, static_cast<size_t>(std::max(1, queued)));
  };
  // httplib's default sets SO_REUSEPORT, which lets a second process bind the
  // same port and take half the connections. SO_REUSEADDR only: a restart can
  // rebind past TIME_WAIT, a second server cannot share a listening port.
  srv.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (options.port == 0) {
    s->port_ = srv.bind_to_any_port(options.host);
  } else {
    s->port_ = srv.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("status endpoint: cannot listen on ", options.host, ":", options.port,
                                               " (taken, or not an address of this machine)"));
  }
  auto listening = std::make_shared<std::atomic<bool>>(true);
  s->thread_ = std::thread([&srv, listening] {
    srv.listen_after_bind();
    *listening = false;
  });
  // stop() does nothing until the accept loop runs (its first statement marks
  // it running): wait for it, so that a Shutdown right after Start cannot hang.
  while (!srv.is_running() && *listening) absl::SleepFor(absl::Milliseconds(1));
  if (!*listening) {
    s->thread_.join();
    return absl::UnavailableError(absl::StrCat("status endpoint: cannot serve on ", options.host, ":", s->port_));
  }
  return s;
}

void StatusServer::Shutdown() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

StatusServer::~StatusServer() { Shutdown(); }

}  // namespace dynapipe::http
