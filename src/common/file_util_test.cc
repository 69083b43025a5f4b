#include "src/common/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
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

TEST_CASE("ConfinedPath keeps job paths under the data root") {
  const std::string root = TempPath("confined_root");
  const std::string outside = TempPath("confined_outside");
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(outside);
  std::filesystem::create_directories(outside);
  std::filesystem::create_directories(root + "/data/flan");
  std::filesystem::create_directory_symlink(outside, root + "/escape");
  const std::string real_root = std::filesystem::canonical(root).string();
  // Relative paths join the root, existing or not (a checkpoint dir to be).
  CHECK(*ConfinedPath(root, "data/flan") == real_root + "/data/flan");
  CHECK(*ConfinedPath(root, "data/new/ckpt/") == real_root + "/data/new/ckpt");
  CHECK(*ConfinedPath(root, "./data/flan") == real_root + "/data/flan");
  // Absolute paths are fine when they lie under the root.
  CHECK(*ConfinedPath(root, real_root + "/data/flan") == real_root + "/data/flan");
  CHECK(*ConfinedPath("/", "/etc/hostname") == "/etc/hostname");
  auto refused = [&](const std::string& path) {
    auto r = ConfinedPath(root, path);
    INFO(path << " -> " << (r.ok() ? *r : std::string(r.status().message())));
    return !r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument &&
           r.status().message().find("outside --data-root") != std::string::npos;
  };
  CHECK(refused("/etc/shadow"));
  CHECK(refused("../x"));
  CHECK(refused("data/../../x"));
  CHECK(refused("data/flan/../../.."));
  CHECK(refused(outside + "/f"));
  CHECK(refused("escape/f"));            // a link inside the root that leads out
  CHECK(refused("escape"));
  CHECK(refused(real_root + "x/data"));  // a sibling whose name starts like the root
  CHECK(ConfinedPath(root, "").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ConfinedPath(root, std::string("a\0b", 3)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ConfinedPath("/nonexistent-root", "x").status().code() == absl::StatusCode::kNotFound);
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
  // A regular file whose bytes cannot be read (EIO) is lost data, not an outage to retry.
  auto unreadable = ReadFile("/proc/self/mem");
  CHECK(unreadable.status().code() == absl::StatusCode::kDataLoss);
  CHECK(unreadable.status().message().find("/proc/self/mem") != std::string::npos);
}

TEST_CASE("ReadSecretFile refuses a secret others can read or write, naming the file, its mode and the fix") {
  const std::string dir = TempPath("secrets");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/token";
  REQUIRE(WriteFileAtomic(path, "s3cret\n").ok());
  for (mode_t mode : {0600, 0400, 0640, 0700}) {
    REQUIRE(::chmod(path.c_str(), mode) == 0);
    auto ok = ReadSecretFile(path);
    INFO(std::oct << mode << ": " << ok.status());
    REQUIRE(ok.ok());
    CHECK(*ok == "s3cret\n");
  }
  for (mode_t mode : {0644, 0604, 0602, 0660, 0620, 0666, 0601}) {
    REQUIRE(::chmod(path.c_str(), mode) == 0);
    auto refused = ReadSecretFile(path);
    INFO(std::oct << mode << ": " << refused.status());
    CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string msg(refused.status().message());
    char mode_text[8];
    std::snprintf(mode_text, sizeof(mode_text), "%04o", static_cast<unsigned>(mode));
    CHECK(msg.find(path + " has mode " + mode_text) != std::string::npos);
    CHECK(msg.find("chmod 600 " + path) != std::string::npos);
    CHECK(msg.find("s3cret") == std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  // The mode judged is the target's, through a link; plain ReadFile does not care.
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  std::filesystem::create_symlink(path, dir + "/link");
  CHECK(ReadSecretFile(dir + "/link").status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReadFile(path).ok());
  CHECK(ReadSecretFile(dir + "/missing").status().code() == absl::StatusCode::kNotFound);
  CHECK(ReadSecretFile("/dev/zero").status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(WriteFileAtomic(path, std::string(kMaxSecretFileBytes + 1, 'x')).ok());
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  CHECK(ReadSecretFile(path).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace dynapipe
