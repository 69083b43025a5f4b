#include "tests/hostile/network_corpus.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "tests/hostile/data_root.h"

namespace dynapipe::testing::hostile {
namespace {

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
// The first 11 bytes of a TLS 1.2 ClientHello record.
constexpr char kClientHello[] = "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03";

// An HTTP/2 frame: 24-bit length (as given, even if it lies), type, flags, stream.
std::string Frame(uint32_t length, uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  f += static_cast<char>((length >> 16) & 0xff);
  f += static_cast<char>((length >> 8) & 0xff);
  f += static_cast<char>(length & 0xff);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  for (int shift : {24, 16, 8, 0}) f += static_cast<char>((stream >> shift) & 0xff);
  return f + payload;
}

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  return Frame(static_cast<uint32_t>(payload.size()), type, flags, stream, payload);
}

std::string Be32(uint32_t v) {
  std::string s;
  for (int shift : {24, 16, 8, 0}) s += static_cast<char>((v >> shift) & 0xff);
  return s;
}

// The preface and an empty SETTINGS frame: a well-begun HTTP/2 connection.
std::string Open() { return std::string(kPreface) + Frame(4, 0, 0, ""); }

std::string Request(const std::string& head, const std::string& body = "") { return head + "\r\n\r\n" + body; }

}  // namespace

std::vector<WireCase> HttpCases() {
  const std::string host = "\r\nHost: 127.0.0.1";
  std::string many_headers = "GET /healthz HTTP/1.1" + host;
  for (int i = 0; i < 10000; ++i) absl::StrAppend(&many_headers, "\r\nX-H", i, ": v");
  std::string tls_hello(kClientHello, 11);
  tls_hello += RandomBytes(160, 41);
  return {
      {"not HTTP: one word", "GARBAGE\r\n\r\n"},
      {"only CRLFs", "\r\n\r\n\r\n\r\n"},
      {"a method and nothing else", "GET\r\n\r\n"},
      {"an HTTP/0.9 request line", "GET /healthz\r\n\r\n"},
      {"protocol HTTP/9.9", Request("GET /healthz HTTP/9.9" + host)},
      {"protocol FOO/1.1", Request("GET /healthz FOO/1.1" + host)},
      {"a 100 KB request target", Request("GET /" + std::string(100 << 10, 'a') + " HTTP/1.1" + host)},
      {"a 1 MB header", Request("GET /healthz HTTP/1.1" + host + "\r\nX-Big: " + std::string(1 << 20, 'b'))},
      {"10,000 headers", Request(many_headers)},
      {"a header line without a colon", Request("GET /healthz HTTP/1.1" + host + "\r\nNoColonHere")},
      {"a bare CR inside a header value", Request("GET /healthz HTTP/1.1" + host + "\r\nX-A: a\rb")},
      {"a NUL in the path", Request(std::string("GET /healthz\0 HTTP/1.1", 22) + host)},
      {"%00 in the path", Request("GET /healthz%00 HTTP/1.1" + host)},
      {"/../../etc/passwd", Request("GET /../../etc/passwd HTTP/1.1" + host)},
      {"/%2e%2e/%2e%2e/etc/passwd", Request("GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1" + host)},
      {"/healthz/../status", Request("GET /healthz/../status HTTP/1.1" + host)},
      {"a malformed percent escape", Request("GET /%zz%ff%G0 HTTP/1.1" + host)},
      {"unknown method BREW", Request("BREW /healthz HTTP/1.1" + host)},
      {"lower-case method get", Request("get /healthz HTTP/1.1" + host)},
      {"a 1 KB method", Request(std::string(1024, 'A') + " /healthz HTTP/1.1" + host)},
      {"CONNECT", Request("CONNECT 127.0.0.1:22 HTTP/1.1" + host)},
      {"TRACE", Request("TRACE /healthz HTTP/1.1" + host)},
      {"POST with a body", Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: 5", "hello")},
      {"PUT with a body", Request("PUT /status HTTP/1.1" + host + "\r\nContent-Length: 5", "hello")},
      {"DELETE", Request("DELETE /status HTTP/1.1" + host)},
      {"PATCH with a body", Request("PATCH /metrics HTTP/1.1" + host + "\r\nContent-Length: 2", "{}")},
      {"POST with Content-Length 10^12", Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: 1000000000000", "x")},
      {"POST with a negative Content-Length", Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: -5", "hello")},
      {"POST with a non-numeric Content-Length", Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: abc", "hello")},
      {"POST with two different Content-Lengths",
       Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: 5\r\nContent-Length: 50", "hello")},
      {"POST with a 1 MB body", Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: 1048576", std::string(1 << 20, 'x'))},
      {"chunked body with a non-hex chunk size",
       Request("POST /healthz HTTP/1.1" + host + "\r\nTransfer-Encoding: chunked", "zz\r\nhello\r\n0\r\n\r\n")},
      {"chunked body with a chunk of 2^72 bytes",
       Request("POST /healthz HTTP/1.1" + host + "\r\nTransfer-Encoding: chunked", "ffffffffffffffffff\r\nhello\r\n")},
      {"Transfer-Encoding and Content-Length together",
       Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: 3\r\nTransfer-Encoding: chunked", "5\r\nhello\r\n0\r\n\r\n")},
      {"Expect: 100-continue for 10 MB",
       Request("POST /healthz HTTP/1.1" + host + "\r\nExpect: 100-continue\r\nContent-Length: 10485760")},
      {"a TLS ClientHello", tls_hello},
      {"1 MB of random bytes", RandomBytes(1 << 20, 42)},
      {"half a request line, then silence", "GET /hea", true},
      {"headers without the blank line, then silence", "GET /healthz HTTP/1.1" + host + "\r\n", true},
      {"5 of 100 body bytes, then silence", Request("POST /healthz HTTP/1.1" + host + "\r\nContent-Length: 100", "hello"), true},
      {"a chunked body that stops, then silence",
       Request("POST /healthz HTTP/1.1" + host + "\r\nTransfer-Encoding: chunked", "10\r\nhel"), true},
      {"a connection that sends nothing", "", true},
  };
}

std::vector<WireCase> GrpcWireCases() {
  const std::string open = Open();
  return {
      {"16 random bytes", RandomBytes(16, 51)},
      {"256 random bytes", RandomBytes(256, 52)},
      {"4 KiB of random bytes", RandomBytes(4096, 53)},
      {"64 KiB of random bytes", RandomBytes(65536, 54)},
      {"1 MiB of zeros", std::string(1 << 20, '\0')},
      {"an HTTP/1.1 GET", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
      {"an HTTP/1.1 POST to a gRPC method",
       "POST /dynapipe.proto.JobService/Submit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/grpc\r\n"
       "Content-Length: 5\r\n\r\n" + std::string(5, '\0')},
      {"a TLS ClientHello", std::string(kClientHello, 11) + RandomBytes(160, 55)},
      {"a wrong HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + RandomBytes(64, 56)},
      {"the preface, then 512 random bytes", std::string(kPreface) + RandomBytes(512, 57)},
      {"a SETTINGS frame of 5 bytes", std::string(kPreface) + Frame(4, 0, 0, "12345")},
      {"a DATA frame claiming 16 MiB", open + Frame(0xffffff, 0, 0, 1, RandomBytes(1000, 58))},
      {"HEADERS with garbage HPACK", open + Frame(1, 0x4, 1, RandomBytes(64, 59))},
      {"HEADERS on stream 0", open + Frame(1, 0x4, 0, "\x82")},
      {"HEADERS on an even (server) stream", open + Frame(1, 0x4, 2, "\x82")},
      {"WINDOW_UPDATE of 0 on the connection", open + Frame(8, 0, 0, Be32(0))},
      {"DATA on an idle stream", open + Frame(0, 0, 7, "hello")},
      {"SETTINGS_INITIAL_WINDOW_SIZE 2^31", open + Frame(4, 0, 0, std::string("\x00\x04", 2) + Be32(0x80000000u))},
      {"CONTINUATION without HEADERS", open + Frame(9, 0x4, 1, "\x82")},
      {"PUSH_PROMISE from the client", open + Frame(5, 0x4, 1, Be32(2) + "\x82")},
      {"RST_STREAM on stream 0", open + Frame(3, 0, 0, Be32(8))},
      {"half the preface, then silence", std::string(kPreface).substr(0, 12), true},
      {"a well-begun connection, then silence", open, true},
      {"a HEADERS frame cut mid-way, then silence", open + Frame(100, 1, 0x4, 1, "\x82\x86"), true},
  };
}

bool HasGoaway(const std::string& b) {
  size_t at = 0;
  while (at + 9 <= b.size()) {
    const uint32_t length = (static_cast<uint8_t>(b[at]) << 16) | (static_cast<uint8_t>(b[at + 1]) << 8) |
                            static_cast<uint8_t>(b[at + 2]);
    const uint8_t type = static_cast<uint8_t>(b[at + 3]);
    if (type == 7 && at + 9 + length <= b.size()) return true;
    at += 9 + length;
  }
  return false;
}

std::string DescribeFrames(const std::string& b) {
  static const char* const kTypes[] = {"DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE",
                                       "PING", "GOAWAY", "WINDOW_UPDATE", "CONTINUATION"};
  static const char* const kErrors[] = {"NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
                                        "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM",
                                        "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM"};
  std::string out;
  size_t at = 0;
  while (at + 9 <= b.size()) {
    const uint32_t length = (static_cast<uint8_t>(b[at]) << 16) | (static_cast<uint8_t>(b[at + 1]) << 8) |
                            static_cast<uint8_t>(b[at + 2]);
    const uint8_t type = static_cast<uint8_t>(b[at + 3]), flags = static_cast<uint8_t>(b[at + 4]);
    if (!out.empty()) out += ", ";
    out += type < 10 ? kTypes[type] : absl::StrCat("type ", type);
    if ((type == 4 || type == 6) && (flags & 1)) out += "(ack)";
    // GOAWAY: last stream (4), error code (4); RST_STREAM: error code (4).
    const size_t code_at = type == 7 ? at + 13 : type == 3 ? at + 9 : 0;
    if (code_at > 0 && code_at + 4 <= b.size()) {
      const uint32_t code = (static_cast<uint8_t>(b[code_at]) << 24) | (static_cast<uint8_t>(b[code_at + 1]) << 16) |
                            (static_cast<uint8_t>(b[code_at + 2]) << 8) | static_cast<uint8_t>(b[code_at + 3]);
      absl::StrAppend(&out, "(", code < 12 ? kErrors[code] : absl::StrCat(code), ")");
    }
    at += 9 + length;
  }
  if (at < b.size()) absl::StrAppend(&out, out.empty() ? "" : ", ", b.size() - at, " bytes");
  return out.empty() ? "nothing" : out;
}

std::vector<WireCase> ProtobufJunk(int random_cases) {
  std::vector<WireCase> v;
  v.push_back({"an empty message", ""});
  for (int i = 0; i < random_cases; ++i) {
    const size_t n = 1 + (static_cast<size_t>(i) * 397) % 2000;
    v.push_back({absl::StrCat(n, " random bytes (seed ", 60 + i, ")"), RandomBytes(n, 60 + i)});
  }
  v.push_back({"groups nested 100,000 deep", std::string(100000, '\x7b') + std::string(100000, '\x7c')});
  v.push_back({"field 1 claiming 4 GiB", std::string("\x0a\xff\xff\xff\xff\x0f", 6) + "abc"});
  v.push_back({"an 11-byte varint", "\x08" + std::string(10, '\xff') + "\x01"});
  v.push_back({"field number 0", std::string("\x00\x01", 2)});
  v.push_back({"wire type 6", "\x0e\x01"});
  v.push_back({"an end-group without a start", "\x0c"});
  v.push_back({"a string that is not UTF-8", std::string("\x0a\x04\x0a\x02\xff\xfe", 6)});
  return v;
}

}  // namespace dynapipe::testing::hostile
