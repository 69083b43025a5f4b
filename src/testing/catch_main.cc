// The Catch2 main of every test binary. Test cases tagged [gpu] need a CUDA
// device: where none is usable they are excluded and the skip is announced in
// a line deploy/test.sh counts ("skipped: N [gpu] test cases: <reason>").
#define CATCH_CONFIG_RUNNER
#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

namespace {

// Probes for a device without linking the CUDA runtime, so CPU-only builds
// share this main. Returns an empty string when a device is usable.
std::string NoGpuReason() {
  void* lib = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return "the CUDA runtime library is not installed";
  using GetCount = int (*)(int*);
  auto get_count = reinterpret_cast<GetCount>(dlsym(lib, "cudaGetDeviceCount"));
  int count = 0;
  const int err = get_count == nullptr ? -1 : get_count(&count);
  if (err != 0 || count == 0) return "no CUDA device is visible on this machine";
  return "";
}

int CountGpuCases() {
  int n = 0;
  for (const auto& tc : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    for (const auto& tag : tc.tags) {
      if (tag == "gpu") {
        ++n;
        break;
      }
    }
  }
  return n;
}

}  // namespace

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const std::string reason = NoGpuReason();
  if (!reason.empty()) {
    const int skipped = CountGpuCases();
    if (skipped > 0) {
      auto& cfg = session.configData();
      if (cfg.testsOrTags.empty()) {
        cfg.testsOrTags.push_back("~[gpu]");
      } else {
        // Catch2 v2 ORs separate specs; an exclusion inside a spec is ANDed.
        for (auto& spec : cfg.testsOrTags) spec += " ~[gpu]";
      }
      session.useConfigData(cfg);
      std::printf("skipped: %d [gpu] test cases: %s\n", skipped, reason.c_str());
    }
  }
  return session.run();
}
