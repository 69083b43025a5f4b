#include "src/common/file_util.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

namespace dynapipe {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name + "_" + std::to_string(::getpid());
}

TEST_CASE("WriteFileAtomic then ReadFile round-trips bytes, including NULs") {
  const std::string path = TempPath("atomic");
  const std::string data("a\0b\nc", 5);
  REQUIRE(WriteFileAtomic(path, data).ok());
  const auto back = ReadFile(path);
  REQUIRE(back.ok());
  CHECK(*back == data);
  // Overwrite: the new content replaces the old and no temporary remains.
  REQUIRE(WriteFileAtomic(path, "second").ok());
  CHECK(*ReadFile(path) == "second");
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    CHECK(entry.path().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("ReadFile of a missing file is NOT_FOUND and names the path") {
  const auto r = ReadFile("/nonexistent/dir/file.txt");
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(r.status().message().find("/nonexistent/dir/file.txt") != std::string::npos);
}

TEST_CASE("WriteFileAtomic into a missing directory fails cleanly") {
  const absl::Status s = WriteFileAtomic("/nonexistent/dir/file.txt", "x");
  CHECK(s.code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dynapipe
