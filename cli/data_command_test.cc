#include "cli/data_command.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "src/data/dataset.h"
#include "src/testing/shell.h"
#include "src/data/tokenizer.h"
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

namespace dynapipe::cli {
namespace {

// The helper beside the test's runfiles, as `dynapipe` finds it beside itself.
std::string Helper() { return dynapipe::testing::Runfiles() + "/cli/dynapipe-tokenize"; }

// A tiny SentencePiece model trained on `lines` of text (SentencePiece's own
// trainer, through the helper); its path.
std::string TrainTokenizer(const std::string& name, const std::vector<std::string>& lines) {
  const std::string corpus = Tmp(name + "-corpus.txt");
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  REQUIRE(WriteFileAtomic(corpus, text).ok());
  const auto run = dynapipe::testing::RunShell(
      absl::StrCat(Helper(), " --train '--input=", corpus, " --model_prefix=", Tmp(name),
                   " --vocab_size=60 --model_type=bpe --character_coverage=1.0 --minloglevel=2'"));
  INFO(run.text);
  REQUIRE(run.rc == 0);
  return Tmp(name) + ".model";
}

TEST_CASE("data import --tokenizer: text through a SentencePiece model, a summary, bad lines refused by number") {
  const std::vector<std::string> words = {"translate the cat into french", "le chat", "summarize this long text",
                                          "short", "what is two plus two", "four", "the dog runs fast"};
  const std::string model = TrainTokenizer("spm", words);
  ::setenv("DYNAPIPE_TOKENIZE", Helper().c_str(), 1);
  auto tokenizer = data::Tokenizer::Load(model, Helper());
  REQUIRE(tokenizer.ok());
  const std::string in = Tmp("text.jsonl");
  REQUIRE(WriteFileAtomic(in, R"({"input": "translate the cat into french", "target": "le chat", "task": "mt"}
{"input": "summarize this long text", "target": "short", "task": "sum"}

{"input": "what is two plus two", "target": "four", "task": "qa"}
{"input": "the dog runs fast", "target": "", "task": "mt"}
)").ok());
  std::string out, err;
  const std::string dir = Tmp("text-ds");
  REQUIRE(Run({"import", "--in", in, "--out", dir, "--tokenizer", model}, &out, &err) == 0);
  CHECK_THAT(out, Contains("imported 4 samples (3 tasks, vocab 60)") && Contains("input tokens") &&
                      Contains("p50") && Contains("task mt               2 samples"));
  auto d = data::Dataset::Open(dir);
  REQUIRE(d.ok());
  REQUIRE((*d)->size() == 4);
  // The ids are the tokenizer's, the target ending with its end-of-sequence id.
  auto ids = (*tokenizer)->Encode("translate the cat into french");
  REQUIRE(ids.ok());
  const auto s0 = (*d)->sample(0);
  CHECK(std::vector<uint32_t>(s0.input.begin(), s0.input.end()) == *ids);
  auto target = (*tokenizer)->Encode("le chat");
  REQUIRE(target.ok());
  target->push_back(static_cast<uint32_t>((*tokenizer)->eos_id()));
  CHECK(std::vector<uint32_t>(s0.target.begin(), s0.target.end()) == *target);
  CHECK((*d)->sample(3).target.size() == 1);  // an empty target is its end-of-sequence id alone

  // Refusals: one line naming the file and line; nothing written.
  const std::string bad = Tmp("bad.jsonl");
  REQUIRE(WriteFileAtomic(bad, "{\"input\": \"short\", \"target\": \"four\"}\n{\"input\": 3}\n").ok());
  const std::string bad_dir = Tmp("bad-ds");
  CHECK(Run({"import", "--in", bad, "--out", bad_dir, "--tokenizer", model}, &out, &err) == 2);
  CHECK_THAT(err, Contains(bad + ":2"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(::access(bad_dir.c_str(), F_OK) != 0);
  REQUIRE(WriteFileAtomic(bad, "{\"input\": \"\", \"target\": \"four\"}\n").ok());
  CHECK(Run({"import", "--in", bad, "--out", bad_dir, "--tokenizer", model}, &out, &err) == 2);
  CHECK_THAT(err, Contains(bad + ":1: empty input"));
  CHECK(Run({"import", "--in", in, "--out", bad_dir, "--tokenizer", in}, &out, &err) == 2);
  CHECK_THAT(err, Contains("not a SentencePiece model"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(::access(bad_dir.c_str(), F_OK) != 0);
  // A helper that cannot run is named.
  auto missing = data::Tokenizer::Load(model, Tmp("no-such-helper"));
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Contains("no-such-helper"));
}

TEST_CASE("data import prints progress on long files") {
  const std::string in = Tmp("ids.jsonl");
  std::string text;
  for (int i = 0; i < 25000; ++i) absl::StrAppend(&text, "{\"input\": [1, 2, ", i % 7, "], \"target\": [3], \"task\": \"t\"}\n");
  REQUIRE(WriteFileAtomic(in, text).ok());
  std::string out, err;
  REQUIRE(Run({"import", "--in", in, "--out", Tmp("ids-ds")}, &out, &err) == 0);
  CHECK_THAT(err, Contains("import: 10000 lines") && Contains("import: 20000 lines"));
  CHECK_THAT(out, Contains("imported 25000 samples"));
}

}  // namespace
}  // namespace dynapipe::cli
