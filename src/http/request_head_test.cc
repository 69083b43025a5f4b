#include "src/http/request_head.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"

namespace dynapipe::http {
namespace {

constexpr char kHost[] = "\r\nHost: 127.0.0.1";

// The status a complete head is refused with, 0 if it is accepted.
int Refusal(const std::string& head) { return ParseRequestHead(head).status; }

std::string Head(const std::string& request_line, const std::string& fields = kHost) {
  return request_line + fields + "\r\n\r\n";
}

TEST_CASE("A well-formed head is parsed: method, path without the query, fields, keep-alive") {
  const HeadResult r = ParseRequestHead(Head("GET /metrics?x=1 HTTP/1.1", "\r\nHost: h:9\r\nAccept:  */* \r\nX-Empty:"));
  REQUIRE(r.head);
  CHECK(r.status == 0);
  CHECK(r.head->method == "GET");
  CHECK(r.head->target == "/metrics?x=1");
  CHECK(r.head->path == "/metrics");
  CHECK(r.head->minor_version == 1);
  CHECK(r.head->Field("accept") == "*/*");  // case-insensitive, blanks stripped
  CHECK(r.head->Field("x-empty") == "");
  CHECK_FALSE(r.head->Field("cookie"));
  CHECK_FALSE(r.head->wants_close);
  CHECK_FALSE(r.head->HasBody());
}

TEST_CASE("Connection and version decide whether the connection stays open") {
  CHECK(ParseRequestHead(Head("GET / HTTP/1.1", "\r\nHost: h\r\nConnection: Close")).head->wants_close);
  CHECK(ParseRequestHead(Head("GET / HTTP/1.0", "")).head->wants_close);  // 1.0 needs no Host
  CHECK_FALSE(ParseRequestHead(Head("GET / HTTP/1.0", "\r\nConnection: keep-alive")).head->wants_close);
  CHECK(ParseRequestHead(Head("GET / HTTP/1.7")).head->minor_version == 1);  // a later 1.x is answered as 1.1
}

TEST_CASE("Lenient-server guesses are refused with 400") {
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\nNoColonHere")) == 400);
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\nX-A: a\rb")) == 400);  // bare CR in a value
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\nX-A: a\nb")) == 400);  // bare LF
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\nX-A : a")) == 400);    // space before the colon
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\nX-A: a\r\n b")) == 400);  // folded line
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\nX-A: a\x01")) == 400);
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: h\r\n: empty name")) == 400);
  CHECK(Refusal(Head("GET  /healthz HTTP/1.1")) == 400);  // two spaces
  CHECK(Refusal(Head("GET /healthz")) == 400);            // HTTP/0.9
  CHECK(Refusal(Head("GET healthz HTTP/1.1")) == 400);    // not origin-form
  CHECK(Refusal(Head(std::string("GET /a\0b HTTP/1.1", 17))) == 400);
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "")) == 400);                        // no Host
  CHECK(Refusal(Head("GET /healthz HTTP/1.1", "\r\nHost: a\r\nHost: b")) == 400);  // two Hosts
  CHECK(Refusal(Head("GET /healthz HTTP/1.0", "\r\nHost: a\r\nHost: b")) == 400);  // in 1.0 too
  CHECK(Refusal("GET /healthz HTTP/1.1\r\nHost: h\r\n") == 400);                   // no blank line
}

TEST_CASE("Body framing a server could misread is refused") {
  CHECK(Refusal(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: -5")) == 400);
  CHECK(Refusal(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: abc")) == 400);
  CHECK(Refusal(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: 5, 5")) == 400);
  CHECK(Refusal(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: 99999999999999999999")) == 400);
  CHECK(Refusal(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 50")) == 400);
  CHECK(Refusal(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked")) == 400);
  const HeadResult same = ParseRequestHead(Head("POST / HTTP/1.1", "\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5"));
  REQUIRE(same.head);
  CHECK(same.head->content_length == 5u);
  CHECK(same.head->HasBody());
  CHECK(ParseRequestHead(Head("POST / HTTP/1.1", "\r\nHost: h\r\nTransfer-Encoding: chunked")).head->HasBody());
}

TEST_CASE("Oversized heads, targets and versions get their own status codes") {
  std::string many;
  for (size_t i = 0; i < kMaxHeaderFields; ++i) absl::StrAppend(&many, "\r\nX-", i, ": v");
  CHECK(Refusal(Head("GET / HTTP/1.1", "\r\nHost: h" + many)) == 431);  // one field over
  std::string at_limit = "\r\nHost: h";
  for (size_t i = 1; i < kMaxHeaderFields; ++i) absl::StrAppend(&at_limit, "\r\nX-", i, ": v");
  CHECK(Refusal(Head("GET / HTTP/1.1", at_limit)) == 0);
  CHECK(Refusal(Head("GET / HTTP/1.1", "\r\nHost: h\r\nX-Big: " + std::string(kMaxRequestHeadBytes, 'b'))) == 431);
  CHECK(Refusal(Head("GET /" + std::string(kMaxRequestTargetBytes, 'a') + " HTTP/1.1")) == 414);
  CHECK(Refusal(Head(std::string(kMaxMethodBytes + 1, 'A') + " / HTTP/1.1")) == 501);
  CHECK(Refusal(Head("GET / HTTP/2.0")) == 505);
  CHECK(Refusal(Head("GET / HTTP/9.9")) == 505);
}

TEST_CASE("A head still arriving is refused as soon as it cannot become valid") {
  CHECK(CheckPartialHead("GET /hea").status == 0);
  CHECK(CheckPartialHead("GET /healthz HTTP/1.1\r\nHost: h\r\n").status == 0);
  CHECK(CheckPartialHead("\x16\x03\x01\x02\x00").status == 400);  // a TLS ClientHello
  CHECK(CheckPartialHead("GARBAGE\r\n").status == 400);
  CHECK(CheckPartialHead("GET /a\rb").status == 400);
  CHECK(CheckPartialHead("GET /healthz HTTP/1.1\r").status == 0);  // the LF may follow
  CHECK(CheckPartialHead("GET /healthz HTTP/9.9\r\nHo").status == 505);
  CHECK(CheckPartialHead("GET /" + std::string(kMaxRequestTargetBytes + 64, 'a')).status == 414);
  CHECK(CheckPartialHead("GET / HTTP/1.1\r\nX: " + std::string(kMaxRequestHeadBytes, 'x')).status == 431);
  CHECK(FindHeadEnd("GET / HTTP/1.1\r\nHost: h\r\n\r\nGET /next") == std::optional<size_t>(27));
  CHECK_FALSE(FindHeadEnd("GET / HTTP/1.1\r\nHost: h\r\n"));
}

TEST_CASE("Refusal reasons never echo the request's bytes") {
  const HeadResult r = ParseRequestHead(Head("GET / HTTP/1.1", "\r\nHost: h\r\nsecret-token-value"));
  CHECK(r.status == 400);
  CHECK(r.why.find("secret") == std::string::npos);
}

}  // namespace
}  // namespace dynapipe::http
