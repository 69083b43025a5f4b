#pragma once

// Raw loopback TCP for tests that send bytes no well-behaved client would
// (malformed HTTP, junk on the gRPC port, requests that stall), with a
// deadline on every wait, and small helpers to read HTTP responses.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dynapipe::testing {

struct Exchange {
  bool closed = false;     // the peer closed or reset the connection
  bool complete = false;   // `complete` held for what came back
  bool timed_out = false;  // neither by the deadline
  std::string response;    // what came back (the first MB)
};

// A client connection to 127.0.0.1:port; closed when destroyed.
class RawConnection {
 public:
  static absl::StatusOr<std::unique_ptr<RawConnection>> Connect(int port);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // Sends `bytes`; false once the peer has closed (what it sent stays readable).
  bool Send(absl::string_view bytes, absl::Time deadline);
  // Reads until `complete(response)` holds, the peer closes, or `deadline`.
  Exchange Read(absl::Time deadline, const std::function<bool(const std::string&)>& complete);

 private:
  explicit RawConnection(int fd) : fd_(fd) {}
  int fd_;
};

// Connect, send `bytes`, Read.
Exchange SendAndRead(int port, absl::string_view bytes, absl::Duration limit,
                     const std::function<bool(const std::string&)>& complete);

// True once `r` holds an HTTP response's headers and all of its
// Content-Length body.
bool HttpResponseComplete(const std::string& r);
// The status code of the HTTP response `r` starts with; -1 if none.
int HttpStatus(const std::string& r);
// "HTTP/1.1 404 Not Found": the first line of `r`.
std::string FirstLine(const std::string& r);

// True when GET /healthz on `http_port` answers 200 within `limit`.
bool HealthzOk(int http_port, absl::Duration limit = absl::Seconds(5));

}  // namespace dynapipe::testing
