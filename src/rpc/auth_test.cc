#include "src/rpc/auth.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/escaping.h"
#include "src/common/file_util.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::rpc {
namespace {

using Catch::Matchers::Contains;

const std::string kToken = "s3cr3t-T0ken_value";

// A 0600 token file holding `text`.
std::string TokenFile(const std::string& name, const std::string& text) {
  static const std::string dir = [] {
    const std::string d = testing::FreshTempDir("auth");
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  const std::string path = dir + "/" + name;
  REQUIRE(WriteFileAtomic(path, text).ok());
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  return path;
}

TEST_CASE("A token file is one line of printable ASCII; blank lines and white space around it are ignored") {
  for (const std::string& text : {kToken, kToken + "\n", "\n\n" + kToken + "\n", "  " + kToken + "\r\n\n", "\t" + kToken}) {
    INFO(absl::CEscape(text));
    auto t = ReadToken(TokenFile("ok", text));
    REQUIRE(t.ok());
    CHECK(*t == kToken);
  }
  CHECK(ReadToken("")->empty());  // no file: no token
}

TEST_CASE("A token file with a BOM, a NUL, a second line or a control byte is refused naming the byte, never the token") {
  struct Bad {
    std::string name, text;
    size_t offset;
    std::string what;
  };
  const std::vector<Bad> bad = {
      {"bom", "\xef\xbb\xbf" + kToken + "\n", 0, "byte order mark"},
      {"nul", kToken.substr(0, 4) + std::string(1, '\0') + kToken.substr(4), 4, "0x00"},
      {"two-lines", kToken + "\n" + kToken + "\n", kToken.size(), "line break"},
      {"space", kToken.substr(0, 6) + " " + kToken.substr(6), 6, "white space"},
      {"escape", "\n" + kToken + "\x1b", kToken.size() + 1, "0x1b"},
      {"latin1", "\xe9" + kToken, 0, "0xe9"},
  };
  for (const Bad& b : bad) {
    INFO(b.name);
    const std::string path = TokenFile(b.name, b.text);
    const auto t = ReadToken(path);
    REQUIRE_FALSE(t.ok());
    const std::string msg(t.status().message());
    CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(msg, Contains(path));
    CHECK_THAT(msg, Contains("byte " + std::to_string(b.offset) + " is"));
    CHECK_THAT(msg, Contains(b.what));
    CHECK(msg.find(kToken.substr(0, 6)) == std::string::npos);  // nothing of the token
    CHECK(msg.find('\n') == std::string::npos);
  }
  auto empty = ReadToken(TokenFile("blank", "\n \n\t\n"));
  CHECK_THAT(std::string(empty.status().message()), Contains("empty token file"));
}

}  // namespace
}  // namespace dynapipe::rpc
