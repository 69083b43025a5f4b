#include "cli/data_command.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <sstream>

#include "src/data/dataset.h"
#include "src/common/file_util.h"

namespace dynapipe::cli {
namespace {

using Catch::Matchers::Contains;

std::string Tmp(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + std::to_string(::getpid()) + "_" + name;
}

int Run(const std::vector<std::string>& args, std::string* out, std::string* err) {
  std::ostringstream o, e;
  const int rc = RunDataCommand(args, o, e);
  *out = o.str();
  *err = e.str();
  return rc;
}

TEST_CASE("data synth writes a dataset following the lengths file; info describes it") {
  const std::string lengths = Tmp("lengths.txt");
  REQUIRE(WriteFileAtomic(lengths, "# test\n10 2\n300 5\n7\n").ok());
  std::string out, err;
  const std::string dir = Tmp("synth");
  REQUIRE(Run({"synth", "--out", dir, "--lengths", lengths, "--samples", "7", "--seed", "3"}, &out, &err) == 0);
  auto d = data::Dataset::Open(dir);
  REQUIRE(d.ok());
  REQUIRE((*d)->size() == 7);
  CHECK((*d)->sample(1).input.size() == 300);
  CHECK((*d)->sample(3).input.size() == 10);  // the list repeats
  CHECK(Run({"info", dir}, &out, &err) == 0);
  CHECK_THAT(out, Contains("7 samples") && Contains("copy_prefix"));
}

TEST_CASE("data import converts JSONL; bad lines are one clear error") {
  const std::string jsonl = Tmp("in.jsonl");
  REQUIRE(WriteFileAtomic(jsonl, "{\"input\": [5, 6, 7], \"target\": [8], \"task\": \"qa\"}\n\n"
                                 "{\"input\": [9], \"target\": [], \"task\": \"sum\"}\n").ok());
  std::string out, err;
  const std::string dir = Tmp("imported");
  REQUIRE(Run({"import", "--in", jsonl, "--out", dir}, &out, &err) == 0);
  auto d = data::Dataset::Open(dir);
  REQUIRE(d.ok());
  CHECK((*d)->size() == 2);
  CHECK((*d)->info().vocab() == 10);
  CHECK((*d)->sample(0).target[0] == 8);

  REQUIRE(WriteFileAtomic(jsonl, "{\"input\": [1]}\n{\"input\": \"oops\"}\n").ok());
  CHECK(Run({"import", "--in", jsonl, "--out", Tmp("bad")}, &out, &err) == 2);
  CHECK_THAT(err, Contains("in.jsonl:2"));
  CHECK(Run({"import", "--in", jsonl + ".missing", "--out", Tmp("bad")}, &out, &err) == 1);
  CHECK(Run({"info", Tmp("nothing")}, &out, &err) != 0);
  CHECK(Run({"synth", "--out", Tmp("x")}, &out, &err) == 2);
}

}  // namespace
}  // namespace dynapipe::cli
