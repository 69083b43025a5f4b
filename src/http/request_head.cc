#include "src/http/request_head.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dynapipe::http {
namespace {

// RFC 9110 tchar: the characters of a method or a field name.
bool IsTokenChar(unsigned char c) {
  if (absl::ascii_isalnum(c)) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// A field value's byte: visible ASCII, obs-text, space or tab.
bool IsFieldValueChar(unsigned char c) { return c == ' ' || c == '\t' || (c >= 0x21 && c != 0x7f); }

HeadResult Refuse(int status, std::string why) { return {std::nullopt, status, std::move(why)}; }

// Checks the request line (without its CRLF) into `head`; a status on refusal.
HeadResult ParseRequestLine(absl::string_view line, RequestHead& head) {
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3) {
    return Refuse(400, "the request line is not \"METHOD TARGET HTTP/1.x\" with single spaces");
  }
  const absl::string_view method = parts[0], target = parts[1], version = parts[2];
  if (!IsToken(method)) return Refuse(400, "the method is not a token");
  if (method.size() > kMaxMethodBytes) return Refuse(501, "unknown method");
  if (target.size() > kMaxRequestTargetBytes) {
    return Refuse(414, absl::StrCat("the request target is longer than ", kMaxRequestTargetBytes, " bytes"));
  }
  if (target.empty() || target[0] != '/') return Refuse(400, "the request target is not a path starting with '/'");
  for (unsigned char c : target) {
    if (c < 0x21 || c > 0x7e) return Refuse(400, "the request target has a byte outside visible ASCII");
  }
  if (version.size() != 8 || !absl::StartsWith(version, "HTTP/") || !absl::ascii_isdigit(version[5]) ||
      version[6] != '.' || !absl::ascii_isdigit(version[7])) {
    return Refuse(400, "the protocol is not HTTP/<digit>.<digit>");
  }
  if (version[5] != '1') return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  head.method = std::string(method);
  head.target = std::string(target);
  head.path = head.target.substr(0, head.target.find('?'));
  head.minor_version = version[7] == '0' ? 0 : 1;  // a later 1.x is answered as 1.1
  return {};
}

// Checks one header field line (without its CRLF) and adds it to `head`.
HeadResult ParseField(absl::string_view line, RequestHead& head) {
  if (line.empty()) return Refuse(400, "an empty header line");
  if (line[0] == ' ' || line[0] == '\t') return Refuse(400, "a folded header line (obsolete line folding)");
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return Refuse(400, "a header line without a colon");
  const absl::string_view name = line.substr(0, colon);
  if (!IsToken(name)) return Refuse(400, "a header name that is not a token (or space before the colon)");
  absl::string_view value = line.substr(colon + 1);
  for (unsigned char c : value) {
    if (!IsFieldValueChar(c)) return Refuse(400, "a control character in a header value");
  }
  value = absl::StripAsciiWhitespace(value);
  if (head.fields.size() == kMaxHeaderFields) {
    return Refuse(431, absl::StrCat("more than ", kMaxHeaderFields, " header fields"));
  }
  head.fields.emplace_back(std::string(name), std::string(value));
  return {};
}

// Content-Length, Transfer-Encoding, Host and Connection, once all fields are in.
HeadResult CheckFraming(RequestHead& head) {
  int hosts = 0;
  bool keep_alive = false;
  for (const auto& [name, value] : head.fields) {
    if (absl::EqualsIgnoreCase(name, "host")) {
      ++hosts;
    } else if (absl::EqualsIgnoreCase(name, "content-length")) {
      uint64_t n = 0;
      const bool digits = !value.empty() && value.size() <= 18 &&
                          value.find_first_not_of("0123456789") == std::string::npos && absl::SimpleAtoi(value, &n);
      if (!digits) return Refuse(400, "Content-Length is not a decimal number");
      if (head.content_length && *head.content_length != n) return Refuse(400, "conflicting Content-Length fields");
      head.content_length = n;
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      head.chunked = true;
    } else if (absl::EqualsIgnoreCase(name, "connection")) {
      for (absl::string_view option : absl::StrSplit(value, ',')) {
        option = absl::StripAsciiWhitespace(option);
        if (absl::EqualsIgnoreCase(option, "close")) head.wants_close = true;
        if (absl::EqualsIgnoreCase(option, "keep-alive")) keep_alive = true;
      }
    }
  }
  if (head.chunked && head.content_length) return Refuse(400, "both Content-Length and Transfer-Encoding");
  if (hosts > 1) return Refuse(400, "more than one Host field");
  if (head.minor_version == 1 && hosts != 1) return Refuse(400, "an HTTP/1.1 request needs exactly one Host field");
  if (head.minor_version == 0 && !keep_alive) head.wants_close = true;
  return {};
}

// Bytes that cannot appear anywhere in a request head.
bool IsForbiddenHeadByte(unsigned char c) { return c == 0x7f || (c < 0x20 && c != '\r' && c != '\n' && c != '\t'); }

}  // namespace

std::optional<absl::string_view> RequestHead::Field(absl::string_view name) const {
  for (const auto& [n, v] : fields) {
    if (absl::EqualsIgnoreCase(n, name)) return absl::string_view(v);
  }
  return std::nullopt;
}

std::optional<size_t> FindHeadEnd(absl::string_view buffer) {
  const size_t end = buffer.find("\r\n\r\n");
  if (end == absl::string_view::npos) return std::nullopt;
  return end + 4;
}

HeadResult CheckPartialHead(absl::string_view partial) {
  for (unsigned char c : partial) {
    if (IsForbiddenHeadByte(c)) return Refuse(400, "a control byte in the request head");
  }
  const size_t eol = partial.find("\r\n");
  // Without its line end yet, a final CR may be the first half of one.
  const bool cr_last = !partial.empty() && partial.back() == '\r';
  const size_t line_end = eol != absl::string_view::npos ? eol : partial.size() - (cr_last ? 1 : 0);
  const absl::string_view first = partial.substr(0, line_end);
  if (first.find_first_of("\r\n") != absl::string_view::npos) return Refuse(400, "a bare CR or LF in the request line");
  if (eol != absl::string_view::npos) {
    RequestHead scratch;
    HeadResult r = ParseRequestLine(first, scratch);
    if (r.status != 0) return r;
  } else if (partial.size() > kMaxMethodBytes + kMaxRequestTargetBytes + 16) {
    return Refuse(414, absl::StrCat("the request line is longer than ", kMaxRequestTargetBytes, " bytes of target"));
  }
  if (partial.size() >= kMaxRequestHeadBytes && !FindHeadEnd(partial)) {
    return Refuse(431, absl::StrCat("the request head is longer than ", kMaxRequestHeadBytes, " bytes"));
  }
  return {};
}

HeadResult ParseRequestHead(absl::string_view head) {
  if (head.size() > kMaxRequestHeadBytes) {
    return Refuse(431, absl::StrCat("the request head is longer than ", kMaxRequestHeadBytes, " bytes"));
  }
  if (!absl::ConsumeSuffix(&head, "\r\n\r\n")) return Refuse(400, "the request head does not end with a blank line");
  for (unsigned char c : head) {
    if (IsForbiddenHeadByte(c)) return Refuse(400, "a control byte in the request head");
  }
  RequestHead out;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
    if (line.find_first_of("\r\n") != absl::string_view::npos) return Refuse(400, "a bare CR or LF in the request head");
    HeadResult r = first ? ParseRequestLine(line, out) : ParseField(line, out);
    if (r.status != 0) return r;
    first = false;
  }
  HeadResult r = CheckFraming(out);
  if (r.status != 0) return r;
  return {std::move(out), 0, ""};
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

}  // namespace dynapipe::http
