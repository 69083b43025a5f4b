#include "src/common/file_util.h"

#include <sys/stat.h>
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

TEST_CASE("AtomicFileWriter: pieces appear only on Commit; dropped, nothing is left behind") {
  const std::string path = TempPath("pieces");
  const std::string dir = std::filesystem::path(path).parent_path().string();
  auto leftovers = [&] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      n += entry.path().filename().string().rfind(std::filesystem::path(path).filename().string() + ".tmp.", 0) == 0;
    }
    return n;
  };
  {
    auto w = AtomicFileWriter::Create(path);
    REQUIRE(w.ok());
    REQUIRE((*w)->Append("abc").ok());
    CHECK(ReadFile(path).status().code() == absl::StatusCode::kNotFound);
    CHECK(leftovers() == 1);
  }  // dropped without Commit
  CHECK(ReadFile(path).status().code() == absl::StatusCode::kNotFound);
  CHECK(leftovers() == 0);

  auto w = AtomicFileWriter::Create(path);
  REQUIRE(w.ok());
  REQUIRE((*w)->Append("abc").ok());
  REQUIRE((*w)->Append(std::string("\0de", 3)).ok());
  REQUIRE((*w)->Commit().ok());
  CHECK(*ReadFile(path) == std::string("abc\0de", 6));
  CHECK(leftovers() == 0);
  CHECK((*w)->Append("x").code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*w)->Commit().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("ResolvePath puts relative paths under the root and leaves the rest alone") {
  CHECK(ResolvePath("/srv/data", "flan/ds") == "/srv/data/flan/ds");
  CHECK(ResolvePath("/srv/data", "/abs/ds") == "/abs/ds");
  CHECK(ResolvePath("", "rel/ds") == "rel/ds");
  CHECK(ResolvePath("/srv/data", "") == "");
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
TEST_CASE("ReadFile refuses what is not a regular file, or more than its limit, without reading it all") {
  // A device that never ends: refused at once, nothing read.
  auto zero = ReadFile("/dev/zero");
  CHECK(zero.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(zero.status().message() == "/dev/zero: not a regular file");
  const std::string dir = TempPath("read_limits");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CHECK(ReadFile(dir).status().code() == absl::StatusCode::kInvalidArgument);
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(ReadFile(fifo).status().code() == absl::StatusCode::kInvalidArgument);  // no writer: must not block
  REQUIRE(WriteFileAtomic(dir + "/f", std::string(100, 'x')).ok());
  CHECK(ReadFile(dir + "/f", 100).ok());
  auto big = ReadFile(dir + "/f", 99);
  CHECK(big.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(big.status().message().find("limit of 99 bytes") != std::string::npos);
  // A path through a file is a bad path, not an outage to retry.
  auto through = ReadFile(dir + "/f/g");
  CHECK(through.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(WriteFileAtomic(dir + "/f/g", "x").code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace dynapipe
