#include "runtime/executor/test_dataset.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "src/data/synth.h"

namespace dynapipe::runtime::executor::testing {

std::string WorkerTestDataset(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name + "_" + std::to_string(::getpid());
  if (std::filesystem::exists(dir + "/dataset.pbtxt")) return dir;
  data::SynthOptions o;
  o.alphabet = 24;
  std::mt19937 rng(11);
  std::vector<data::RawLength> lengths;
  for (int i = 0; i < 96; ++i) lengths.push_back({6 + static_cast<int64_t>(rng() % 56), 2 + static_cast<int64_t>(rng() % 10)});
  auto w = data::DatasetWriter::Create(dir, data::SynthInfo(o));
  REQUIRE(w.ok());
  REQUIRE(data::Synthesize(lengths, o, w->get()).ok());
  REQUIRE((*w)->Finish().ok());
  return dir;
}

}  // namespace dynapipe::runtime::executor::testing
