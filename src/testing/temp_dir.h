#pragma once

// Scratch directories for tests.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace dynapipe::testing {

// TEST_TMPDIR (else /tmp) / name_PID, removed first so the test starts empty.
inline std::string FreshTempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace dynapipe::testing
