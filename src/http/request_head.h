#pragma once

// A strict parser for an HTTP/1.x request head (request line and header
// fields, RFC 9112), for the read-only status endpoint. Anything a lenient
// server would guess at is refused with the status code to answer: bare CR or
// LF line ends, header lines without a colon or with space before it, folded
// lines, control characters, too many or too long header fields, HTTP/1.1
// without exactly one Host, conflicting or malformed Content-Length. The
// endpoint never reads a body, so the head is all it parses.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

namespace dynapipe::http {

// Limits of a request head; a head beyond them is refused (431 / 414).
inline constexpr size_t kMaxRequestHeadBytes = 8 << 10;
inline constexpr size_t kMaxRequestTargetBytes = 2 << 10;
inline constexpr size_t kMaxHeaderFields = 64;
inline constexpr size_t kMaxMethodBytes = 16;

struct RequestHead {
  std::string method;  // as sent: methods are case-sensitive
  std::string target;  // origin-form, starts with '/'
  std::string path;    // target up to '?'
  int minor_version = 1;  // HTTP/1.<minor_version>; 0 or 1
  std::vector<std::pair<std::string, std::string>> fields;  // name as sent, value without surrounding blanks
  // Body framing the client announced (the endpoint never reads a body).
  std::optional<uint64_t> content_length;
  bool chunked = false;  // any Transfer-Encoding
  bool wants_close = false;  // "Connection: close", or HTTP/1.0 without keep-alive

  // The first field's value for a name (case-insensitive), if any.
  std::optional<absl::string_view> Field(absl::string_view name) const;
  bool HasBody() const { return chunked || content_length.value_or(0) > 0; }
};

// Either a head or the response status to refuse it with, and why (one line,
// safe to send back: it never echoes the request's bytes).
struct HeadResult {
  std::optional<RequestHead> head;
  int status = 0;
  std::string why;
};

// Where the head in `buffer` ends: the offset just past the "\r\n\r\n" that
// closes it, or nullopt if it has not arrived yet.
std::optional<size_t> FindHeadEnd(absl::string_view buffer);

// Checks a head still arriving (no blank line yet), so that garbage, a bad
// request line or an oversized head is refused without waiting for the rest:
// status 0 while it may still become a valid head.
HeadResult CheckPartialHead(absl::string_view partial);

// Parses `head` (up to and including the closing blank line).
HeadResult ParseRequestHead(absl::string_view head);

// The reason phrase for the status codes the endpoint sends.
const char* ReasonPhrase(int status);

}  // namespace dynapipe::http
