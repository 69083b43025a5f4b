#include "src/http/status_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/mutex.h"
#include "src/http/request_head.h"

namespace dynapipe::http {

// A fixed number of workers and a bounded queue of accepted connections: when
// the queue is full, Enqueue (called by the accept loop) waits for a free slot,
// so connections beyond it wait in the kernel's backlog instead of piling up.
class StatusServer::Pool {
 public:
  Pool(int workers, size_t max_queued) : max_queued_(std::max<size_t>(1, max_queued)) {
    for (int i = 0; i < std::max(1, workers); ++i) threads_.emplace_back([this] { Work(); });
  }
  ~Pool() { Shutdown(); }

  // False once shut down (the task is not run).
  bool Enqueue(std::function<void()> fn) {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return queue_.size() < max_queued_ || shutdown_; });
    if (shutdown_) return false;
    queue_.push_back(std::move(fn));
    return true;
  }

  // Runs what is queued, then joins the workers.
  void Shutdown() {
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

namespace {

// Bytes read from a connection at a time, and the most drained from a client
// still sending after a response that closes the connection.
constexpr size_t kReadChunk = 4096;
constexpr size_t kMaxDrainBytes = 4 << 20;

enum class Wait { kReady, kTimeout, kStopped, kError };

// Waits until `fd` is ready for `events`, `deadline` passes or the server stops.
Wait WaitFor(int fd, short events, int stop_fd, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return Wait::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
                                                      60'000));
    const int n = ::poll(fds, 2, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Wait::kError;
    if (fds[1].revents != 0) return Wait::kStopped;
    if (fds[0].revents & (events | POLLHUP | POLLERR)) return Wait::kReady;
  }
}

// Appends what arrives on `fd` before `deadline` to `buf`: bytes read, 0 at
// end of stream, -1 on timeout, stop or error.
ssize_t ReadSome(int fd, int stop_fd, absl::Time deadline, std::string& buf) {
  while (true) {
    char chunk[kReadChunk];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n >= 0) {
      buf.append(chunk, static_cast<size_t>(n));
      return n;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (WaitFor(fd, POLLIN, stop_fd, deadline) != Wait::kReady) return -1;
  }
}

// A stopping server still finishes a response, within its deadline.
bool WriteAll(int fd, absl::Time deadline, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (WaitFor(fd, POLLOUT, -1, deadline) != Wait::kReady) return false;
  }
  return true;
}

// Closes after a response: stops sending, then reads and drops what the client
// is still sending (a body the endpoint never reads), so that closing does not
// reset the connection before the client has read the response. Bounded in
// bytes and time.
void LingeringClose(int fd, int stop_fd, absl::Duration limit) {
  ::shutdown(fd, SHUT_WR);
  const absl::Time deadline = absl::Now() + limit;
  std::string sink;
  size_t drained = 0;
  while (drained < kMaxDrainBytes) {
    sink.clear();
    const ssize_t n = ReadSome(fd, stop_fd, deadline, sink);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
  ::close(fd);
}

std::string ResponseBytes(int status, absl::string_view content_type, absl::string_view body, bool head_only,
                          bool close) {
  std::string out = absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(),
                                 "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: ",
                                 close ? "close" : "keep-alive", "\r\n");
  if (status == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head_only) out.append(body.data(), body.size());
  return out;
}

bool IsKnownMethod(absl::string_view m) {
  for (absl::string_view known : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}) {
    if (m == known) return true;
  }
  return false;
}

}  // namespace

StatusServer::StatusServer(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<StatusServer>> StatusServer::Start(Options options) {
  std::unique_ptr<StatusServer> s(new StatusServer(std::move(options)));
  const Options& o = s->options_;
  const std::string where = absl::StrCat(o.host, ":", o.port);
  if (o.port < 0 || o.port > 65535) return absl::InvalidArgumentError(absl::StrCat("status endpoint: bad port ", o.port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port = std::to_string(o.port);
  if (const int rc = ::getaddrinfo(o.host.c_str(), port.c_str(), &hints, &addrs); rc != 0) {
    return absl::UnavailableError(absl::StrCat("status endpoint: cannot resolve ", where, ": ", ::gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = addrs; a != nullptr && s->listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // SO_REUSEADDR, never SO_REUSEPORT: a restart can rebind past TIME_WAIT,
    // a second server cannot share (and take half the connections of) a
    // listening port.
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    s->listen_fd_ = fd;
  }
  ::freeaddrinfo(addrs);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("status endpoint: cannot listen on ", where, ": ", why, " (taken, or not an address of this machine)"));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) {
    ::close(s->listen_fd_);
    s->listen_fd_ = -1;
    return absl::UnavailableError(absl::StrCat("status endpoint: eventfd: ", std::strerror(errno)));
  }
  s->pool_ = std::make_unique<Pool>(o.workers, static_cast<size_t>(std::max(1, o.max_queued_connections)));
  s->accept_thread_ = std::thread([raw = s.get()] { raw->AcceptLoop(); });
  return s;
}

void StatusServer::AcceptLoop() {
  while (true) {
    // No deadline needed: Shutdown makes stop_fd_ readable.
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) absl::SleepFor(absl::Milliseconds(10));
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors: back off rather than spin on a pending connection.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        absl::SleepFor(absl::Milliseconds(50));
      }
      continue;
    }
    if (!pool_->Enqueue([this, fd] { Serve(fd); })) ::close(fd);
  }
}

StatusServer::Response StatusServer::Route(const RequestHead& head) const {
  if (head.method != "GET" && head.method != "HEAD") {
    if (IsKnownMethod(head.method)) return {405, "text/plain", "read-only endpoint: GET or HEAD only\n"};
    return {501, "text/plain", "unknown method\n"};
  }
  if (head.HasBody()) return {400, "text/plain", "bad request: a GET or HEAD request takes no body\n"};
  if (head.path == "/healthz") {
    const std::string why = options_.health ? options_.health() : "";
    if (why.empty()) return {200, "text/plain", "ok\n"};
    return {503, "text/plain", "unhealthy: " + why + "\n"};
  }
  if (head.path == "/status") return {200, "application/json", options_.status ? options_.status() : "{}"};
  if (head.path == "/metrics") return {200, "text/plain; version=0.0.4", options_.metrics ? options_.metrics() : ""};
  return {404, "text/plain", "not found: /healthz, /status or /metrics\n"};
}

void StatusServer::Serve(int fd) {
  std::string buf;  // bytes received and not yet answered (a client may pipeline)
  for (int served = 0;; ++served) {
    // The first byte of a request: within the read timeout of the connection
    // opening, or the keep-alive timeout after the previous response.
    const absl::Duration first_byte = served == 0 ? options_.read_timeout : options_.keep_alive_timeout;
    if (buf.empty() && ReadSome(fd, stop_fd_, absl::Now() + first_byte, buf) <= 0) break;
    // Then the whole head within the read timeout: a trickle cannot hold a
    // worker longer than that.
    const absl::Time head_deadline = absl::Now() + options_.read_timeout;
    std::optional<size_t> end;
    HeadResult checked;
    while (!(end = FindHeadEnd(buf)) && (checked = CheckPartialHead(buf)).status == 0) {
      const ssize_t n = ReadSome(fd, stop_fd_, head_deadline, buf);
      if (n == 0) checked = {std::nullopt, 400, "the connection was closed before the request head ended"};
      if (n < 0) checked = {std::nullopt, 408, "the request head did not arrive in time"};
      if (n <= 0) break;
    }
    HeadResult parsed = end ? ParseRequestHead(absl::string_view(buf).substr(0, *end)) : std::move(checked);
    const bool head_only = parsed.head && parsed.head->method == "HEAD";
    Response r;
    bool close = true;
    if (parsed.head) {
      r = Route(*parsed.head);
      // The endpoint never reads a body: a request announcing one ends the connection.
      close = parsed.head->wants_close || parsed.head->HasBody() || served + 1 >= options_.keep_alive_max_requests;
      buf.erase(0, *end);
    } else {
      r = {parsed.status, "text/plain", absl::StrCat(ReasonPhrase(parsed.status), ": ", parsed.why, "\n")};
    }
    const bool wrote = WriteAll(fd, absl::Now() + options_.write_timeout,
                                ResponseBytes(r.status, r.content_type, r.body, head_only, close));
    if (!wrote) break;
    if (close || shut_down_.load()) {
      // Bytes the client sent that were never read (a body, a refused head)
      // would make close() reset the connection, perhaps before the client
      // has read the response: drain them first. A stalled client (408)
      // sends nothing more.
      const bool unread = parsed.status != 408 && (!buf.empty() || !parsed.head || parsed.head->HasBody());
      if (unread) {
        LingeringClose(fd, stop_fd_, options_.read_timeout);
        return;
      }
      break;
    }
  }
  ::close(fd);
}

void StatusServer::Shutdown() {
  if (shut_down_.exchange(true)) return;
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (pool_) pool_->Shutdown();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
  listen_fd_ = stop_fd_ = -1;
}

StatusServer::~StatusServer() { Shutdown(); }

}  // namespace dynapipe::http
