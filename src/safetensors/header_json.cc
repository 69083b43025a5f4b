#include "src/safetensors/header_json.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace dynapipe::safetensors::internal {

namespace {

constexpr int kMaxDepth = 4;  // header object > tensor entry > shape array (> nothing deeper)


class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<Json> Document() {
    Json v;
    if (absl::Status st = Value(v, 0); !st.ok()) return st;
    Skip();
    if (i_ != s_.size()) return Error("trailing bytes after the header's JSON");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("header JSON at byte ", i_, ": ", what));
  }
  void Skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  absl::Status Value(Json& out, int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    Skip();
    if (i_ >= s_.size()) return Error("unexpected end");
    const char c = s_[i_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out.kind = Json::kString;
      return String(out.str);
    }
    if (c >= '0' && c <= '9') return Number(out);
    return Error(absl::StrCat("unsupported value starting with '", std::string(1, c), "'"));
  }
  absl::Status Object(Json& out, int depth) {
    out.kind = Json::kObject;
    ++i_;  // '{'
    Skip();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return absl::OkStatus();
    }
    std::set<std::string> seen;
    while (true) {
      Skip();
      if (i_ >= s_.size() || s_[i_] != '"') return Error("expected a key");
      std::string key;
      if (absl::Status st = String(key); !st.ok()) return st;
      if (!seen.insert(key).second) return Error(absl::StrCat("duplicate key \"", key, "\""));
      Skip();
      if (i_ >= s_.size() || s_[i_] != ':') return Error("expected ':'");
      ++i_;
      Json v;
      if (absl::Status st = Value(v, depth + 1); !st.ok()) return st;
      out.keys.push_back(std::move(key));
      out.values.push_back(std::move(v));
      Skip();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}'");
    }
  }
  absl::Status Array(Json& out, int depth) {
    out.kind = Json::kArray;
    ++i_;  // '['
    Skip();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return absl::OkStatus();
    }
    while (true) {
      Json v;
      if (absl::Status st = Value(v, depth + 1); !st.ok()) return st;
      out.values.push_back(std::move(v));
      Skip();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']'");
    }
  }
  absl::Status Number(Json& out) {
    out.kind = Json::kNumber;
    const size_t start = i_;
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[i_] - '0');
      if (v > (UINT64_MAX - digit) / 10) return Error("integer too large");
      v = v * 10 + digit;
      ++i_;
    }
    if (i_ - start > 1 && s_[start] == '0') return Error("integer with a leading zero");
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) return Error("not an integer");
    out.num = v;
    return absl::OkStatus();
  }
  static void Utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  absl::Status Hex4(uint32_t* cp) {
    if (i_ + 4 > s_.size()) return Error("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return Error("bad \\u escape");
      }
    }
    *cp = v;
    return absl::OkStatus();
  }
  absl::Status String(std::string& out) {
    ++i_;  // '"'
    while (true) {
      if (i_ >= s_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return absl::OkStatus();
      if (c < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status st = Hex4(&cp); !st.ok()) return st;
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            uint32_t low = 0;
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') return Error("lone surrogate");
            i_ += 2;
            if (absl::Status st = Hex4(&low); !st.ok()) return st;
            if (low < 0xDC00 || low >= 0xE000) return Error("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return Error("lone surrogate");
          }
          Utf8(cp, out);
          break;
        }
        default: return Error("bad escape");
      }
    }
  }

  absl::string_view s_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<Json> ParseJson(absl::string_view text) { return Parser(text).Document(); }

}  // namespace dynapipe::safetensors::internal
