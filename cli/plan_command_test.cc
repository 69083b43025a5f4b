#include "cli/plan_command.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "planner/plan/validate.h"
#include "proto/plan.pb.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"

namespace dynapipe::cli {
namespace {

using Catch::Matchers::Contains;

struct Run {
  int rc;
  std::string out, err;
};

// Runs from the runfiles root so configs/models names resolve.
Run Plan(std::vector<std::string> args) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir != nullptr) std::filesystem::current_path(std::string(srcdir) + "/dynapipe");
  std::ostringstream out, err;
  const int rc = RunPlanCommand(args, out, err);
  return {rc, out.str(), err.str()};
}

std::string Temp(const std::string& name, const std::string& contents) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + std::to_string(::getpid()) + "_" + name;
  REQUIRE(WriteFileAtomic(path, contents).ok());
  return path;
}

google::protobuf::Struct ParseObject(const std::string& line) {
  google::protobuf::Struct s;
  INFO(line);
  REQUIRE(ParseJsonProto(line, "output", &s).ok());
  return s;
}

const std::string kFlan = "tests/data/flan-like-lengths.txt";

void CheckOneLineError(const Run& r, const std::string& needle) {
  CHECK(r.rc != 0);
  CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Contains(needle));
}

TEST_CASE("Bad input gets one clear line and a non-zero exit") {
  CheckOneLineError(Plan({"--lengths", "/nonexistent/lengths.txt", "--model", "gpt-tiny"}), "/nonexistent/lengths.txt");
  CheckOneLineError(Plan({"--lengths", Temp("a.txt", "10 2\nabc 3\n"), "--model", "gpt-tiny"}), ":2: field 1 is not a whole number");
  CheckOneLineError(Plan({"--lengths", Temp("b.txt", "10 2\n0 3\n"), "--model", "gpt-tiny"}), ":2: the input length must be positive");
  CheckOneLineError(Plan({"--lengths", Temp("c.txt", "-5\n"), "--model", "gpt-tiny"}), ":1: the input length must be positive");
  CheckOneLineError(Plan({"--lengths", Temp("d.txt", "5 -1\n"), "--model", "gpt-tiny"}), ":1: the target length is negative");
  CheckOneLineError(Plan({"--lengths", Temp("e.txt", "# only a comment\n"), "--model", "gpt-tiny"}), "no samples");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "no-such-model"}), "no-such-model");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--stages", "x"}), "--stages");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--bogus", "1"}), "unknown flag --bogus");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--batching", "magic"}), "magic");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-6.7b", "--stages", "1", "--mem-limit-mb", "20000"}),
                    "does not fit");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--stages", "9"}), "9 stages for only 4 layers");
  CheckOneLineError(Plan({"--model", "gpt-tiny"}), "--lengths is required");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--tolerance", "-0.5"}), "--tolerance");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--micro-batch-size", "-3"}), "--micro-batch-size");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--permutations", "100000"}), "--permutations");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--mem-limit-mb", "nan"}), "--mem-limit-mb");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--iters", "0"}), "nothing to plan");
  CheckOneLineError(Plan({"--lengths", kFlan, "--model", "gpt-tiny", "--dp", "3", "--global-batch-tokens", "10"}),
                    "data-parallel groups");
}

TEST_CASE("--json prints one object per iteration with the documented fields, then a summary") {
  const Run r = Plan({"--lengths", kFlan, "--model", "gpt-6.7b", "--stages", "8", "--layers-per-stage", "4",
                      "--max-seqlen", "8192", "--mem-limit-mb", "80000", "--device", "h100", "--iters", "3", "--json"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 4);
  for (int i = 0; i < 3; ++i) {
    const auto o = ParseObject(lines[i]);
    for (const char* f : {"iteration", "samples", "tokens", "micro_batches", "predicted_iteration_ms",
                          "padding_efficiency", "peak_memory_mb", "schedule", "recompute", "plan_ms"}) {
      CHECK(o.fields().contains(f));
    }
    CHECK(o.fields().at("iteration").number_value() == i);
    CHECK(o.fields().at("tokens").number_value() <= 65536);
    CHECK(o.fields().at("tokens").number_value() > 60000);
    CHECK(o.fields().at("peak_memory_mb").list_value().values_size() == 8);
    for (const auto& p : o.fields().at("peak_memory_mb").list_value().values()) CHECK(p.number_value() <= 80000);
    const auto& mbs = o.fields().at("micro_batches").list_value();
    CHECK(mbs.values_size() > 4);
    for (const auto& mb : mbs.values()) {
      CHECK(mb.struct_value().fields().at("mbs").number_value() >= 1);
      CHECK(static_cast<int>(mb.struct_value().fields().at("seq").number_value()) % 8 == 0);
    }
    const auto& plan_ms = o.fields().at("plan_ms").struct_value().fields();
    for (const char* f : {"partition", "schedule", "instructions", "validate", "total"}) CHECK(plan_ms.contains(f));
  }
  const auto summary = ParseObject(lines[3]);
  CHECK(summary.fields().at("summary").bool_value());
  CHECK(summary.fields().at("tokens_per_s").number_value() > 0);
  CHECK(summary.fields().contains("median_plan_ms"));
}

TEST_CASE("--compare --json ranks dynamic ahead of every method") {
  const Run r = Plan({"--lengths", kFlan, "--model", "gpt-6.7b", "--stages", "8", "--max-seqlen", "8192",
                      "--device", "h100", "--iters", "4", "--compare", "--json"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::map<std::string, double> tps, rel;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    const auto o = ParseObject(std::string(line));
    const std::string m = o.fields().at("method").string_value();
    tps[m] = o.fields().at("tokens_per_s").number_value();
    rel[m] = o.fields().at("relative_to_packing").number_value();
    CHECK(o.fields().contains("padding_efficiency"));
    CHECK(o.fields().at("median_dp_imbalance").number_value() >= 1.0);
  }
  REQUIRE(tps.size() == 7);
  CHECK(rel["packing"] == Catch::Detail::Approx(1.0));
  CHECK(tps["dynamic"] > tps["packing"]);
  CHECK(tps["dynamic"] > tps["padding"]);
  // The other methods' splits are among dynamic's candidates.
  for (const auto& [method, rate] : tps) CHECK(tps["dynamic"] >= rate * (1 - 1e-6));
}

TEST_CASE("--compare names the attention kernel the cost model prices, and the data-parallel imbalance") {
  for (const std::string kernel : {"varlen", "materialized"}) {
    const Run r = Plan({"--lengths", kFlan, "--model", "gpt-350m", "--stages", "2", "--dp", "2", "--max-seqlen",
                        "2048", "--device", "h100", "--iters", "2", "--compare", "--attention", kernel});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Contains(kernel == "varlen" ? "(fused attention)" : "(materialized attention)"));
    CHECK_THAT(r.out, Contains("dp imbalance"));
    CHECK_THAT(r.out, Contains("packing_balanced") && Contains("wlb"));
  }
  const Run bad = Plan({"--lengths", kFlan, "--model", "gpt-350m", "--ablate", "everything"});
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.err, Contains("--ablate: unknown part \"everything\""));
}

TEST_CASE("--dump-plans writes every rank's plan, and the plans validate from disk; --trace writes JSON") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/plans_" + std::to_string(::getpid());
  const std::string trace = dir + "_trace.json";
  const Run r = Plan({"--lengths", kFlan, "--model", "gpt-350m", "--stages", "4", "--dp", "2", "--max-seqlen", "4096",
                      "--iters", "2", "--dump-plans", dir, "--trace", trace});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  for (int it = 0; it < 2; ++it) {
    std::vector<proto::ExecutionPlan> plans(8);
    for (int rank = 0; rank < 8; ++rank) {
      REQUIRE(LoadProtoFile(dir + "/iter_" + std::to_string(it) + "_rank_" + std::to_string(rank) + ".json",
                            &plans[rank]).ok());
    }
    CHECK(planner::ValidatePlans(plans).ok());
  }
  auto text = ReadFile(trace);
  REQUIRE(text.ok());
  const auto o = ParseObject(*text);
  CHECK(o.fields().at("traceEvents").list_value().values_size() > 10);
}

}  // namespace
}  // namespace dynapipe::cli
