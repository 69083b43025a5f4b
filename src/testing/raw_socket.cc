#include "src/testing/raw_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/testing/loopback.h"

namespace dynapipe::testing {
namespace {

constexpr size_t kMaxResponse = size_t{1} << 20;

int WaitMs(absl::Time deadline) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()), 0, 1000));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RawConnection>> RawConnection::Connect(int port) {
  const int fd = ConnectLoopback(port, absl::Seconds(10));
  if (fd < 0) return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);  // every wait below polls with its own deadline
  return std::unique_ptr<RawConnection>(new RawConnection(fd));
}

RawConnection::~RawConnection() { ::close(fd_); }

bool RawConnection::Send(absl::string_view bytes, absl::Time deadline) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Now() >= deadline) return false;
      struct pollfd p = {fd_, POLLOUT, 0};
      ::poll(&p, 1, WaitMs(deadline));
      if (p.revents & (POLLERR | POLLHUP)) return false;
      continue;
    }
    return false;  // EPIPE / ECONNRESET: the peer closed
  }
  return true;
}

Exchange RawConnection::Read(absl::Time deadline, const std::function<bool(const std::string&)>& complete) {
  Exchange e;
  char buf[65536];
  while (true) {
    if (complete && complete(e.response)) {
      e.complete = true;
      return e;
    }
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      if (e.response.size() < kMaxResponse) e.response.append(buf, std::min<size_t>(n, kMaxResponse - e.response.size()));
      continue;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      e.closed = true;
      if (complete && complete(e.response)) e.complete = true;
      return e;
    }
    if (absl::Now() >= deadline) {
      e.timed_out = true;
      return e;
    }
    struct pollfd p = {fd_, POLLIN, 0};
    ::poll(&p, 1, WaitMs(deadline));
  }
}

Exchange SendAndRead(int port, absl::string_view bytes, absl::Duration limit,
                     const std::function<bool(const std::string&)>& complete) {
  const absl::Time deadline = absl::Now() + limit;
  auto c = RawConnection::Connect(port);
  if (!c.ok()) {
    Exchange e;
    e.closed = true;
    return e;
  }
  (*c)->Send(bytes, deadline);  // a peer that closes mid-request is read below
  return (*c)->Read(deadline, complete);
}

bool HttpResponseComplete(const std::string& r) {
  const size_t end = r.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  size_t length = 0;
  const std::string headers = absl::AsciiStrToLower(r.substr(0, end));
  const size_t cl = headers.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    const size_t from = cl + 17;
    const size_t eol = headers.find("\r\n", from);
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(headers.substr(from, eol - from)), &length);
  }
  return r.size() >= end + 4 + length;
}

int HttpStatus(const std::string& r) {
  if (r.rfind("HTTP/1.", 0) != 0 || r.size() < 12) return -1;
  int code;
  return absl::SimpleAtoi(r.substr(9, 3), &code) ? code : -1;
}

std::string FirstLine(const std::string& r) { return r.substr(0, std::min(r.find("\r\n"), size_t{200})); }

bool HealthzOk(int http_port, absl::Duration limit) {
  const Exchange e =
      SendAndRead(http_port, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", limit,
                  HttpResponseComplete);
  return e.complete && HttpStatus(e.response) == 200;
}

}  // namespace dynapipe::testing
