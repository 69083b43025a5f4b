#include "fuzz/scratch_dir.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace dynapipe::fuzz {
namespace {

[[noreturn]] void Die(const char* what, const std::string& path) {
  std::perror(what);
  std::fprintf(stderr, "fuzz scratch: %s %s failed\n", what, path.c_str());
  std::abort();
}

class Scratch {
 public:
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string parent = "/tmp";
    if (tmp != nullptr && *tmp != '\0') {
      parent = tmp;
    } else if (::access("/dev/shm", W_OK | X_OK) == 0) {
      parent = "/dev/shm";
    }
    std::string pattern = parent + "/dynapipe-fuzz.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) Die("mkdtemp", pattern);
    path_ = pattern;
  }
  // Runs at a normal exit (libFuzzer's -runs / -max_total_time end with exit());
  // a crashing run leaves the directory for the crash to be reproduced from.
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

const std::string& ScratchDir() {
  static Scratch scratch;  // made on first use, removed at exit
  return scratch.path();
}

void WriteScratchFile(const std::string& path, absl::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) Die("fopen", path);
  const bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) Die("write", path);
}

}  // namespace dynapipe::fuzz
