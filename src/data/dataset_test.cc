#include "src/data/dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

#include "src/data/synth.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::data {
namespace {

TEST_CASE("Datasets round-trip through the writer and the memory-mapped reader") {
  const std::string dir = testing::FreshTempDir("roundtrip");
  proto::DatasetInfo info;
  info.set_vocab(100);
  info.add_tasks("a");
  info.add_tasks("b");
  auto w = DatasetWriter::Create(dir, info);
  REQUIRE(w.ok());
  std::mt19937 rng(3);
  std::vector<std::vector<uint32_t>> ins, tgts;
  for (int i = 0; i < 50; ++i) {
    std::vector<uint32_t> in(1 + rng() % 40), tg(rng() % 10);
    for (auto& x : in) x = rng() % 100;
    for (auto& x : tg) x = rng() % 100;
    REQUIRE((*w)->Add(in, tg, i % 2).ok());
    ins.push_back(in);
    tgts.push_back(tg);
  }
  CHECK((*w)->Add(std::vector<uint32_t>{}, {}, 0).code() == absl::StatusCode::kInvalidArgument);
  CHECK((*w)->Add(std::vector<uint32_t>{100}, {}, 0).code() == absl::StatusCode::kInvalidArgument);
  CHECK((*w)->Add(std::vector<uint32_t>{5}, {}, 2).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE((*w)->Finish().ok());

  auto d = Dataset::Open(dir);
  REQUIRE(d.ok());
  REQUIRE((*d)->size() == 50);
  CHECK((*d)->info().tasks_size() == 2);
  for (int i = 0; i < 50; ++i) {
    const SampleView s = (*d)->sample(i);
    CHECK(std::vector<uint32_t>(s.input.begin(), s.input.end()) == ins[i]);
    CHECK(std::vector<uint32_t>(s.target.begin(), s.target.end()) == tgts[i]);
    CHECK(s.task == static_cast<uint32_t>(i % 2));
  }
  const auto lengths = (*d)->Lengths();
  CHECK(lengths[7].input == static_cast<int64_t>(ins[7].size()));
  CHECK(lengths[7].target == static_cast<int64_t>(tgts[7].size()));
}

TEST_CASE("Corrupt or truncated datasets are DATA_LOSS") {
  const std::string dir = testing::FreshTempDir("corrupt");
  proto::DatasetInfo info;
  info.set_vocab(10);
  info.add_tasks("a");
  auto w = DatasetWriter::Create(dir, info);
  for (int i = 0; i < 5; ++i) REQUIRE((*w)->Add(std::vector<uint32_t>{1, 2, 3}, std::vector<uint32_t>{4}, 0).ok());
  REQUIRE((*w)->Finish().ok());
  REQUIRE(Dataset::Open(dir).ok());
  std::filesystem::resize_file(dir + "/tokens.bin", std::filesystem::file_size(dir + "/tokens.bin") - 4);
  CHECK(Dataset::Open(dir).status().code() == absl::StatusCode::kDataLoss);
  {
    std::fstream f(dir + "/index.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.write("XXXX", 4);
  }
  CHECK(Dataset::Open(dir).status().code() == absl::StatusCode::kDataLoss);
  CHECK(Dataset::Open(dir + "/nope").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("An index whose lengths wrap 32 bits, or whose counts wrap a size check, is DATA_LOSS") {
  const std::string dir = testing::FreshTempDir("wrap");
  proto::DatasetInfo info;
  info.set_vocab(10);
  info.add_tasks("a");
  auto w = DatasetWriter::Create(dir, info);
  REQUIRE((*w)->Add(std::vector<uint32_t>{1}, std::vector<uint32_t>{2}, 0).ok());  // offset 0, 2 tokens
  REQUIRE((*w)->Add(std::vector<uint32_t>{3}, std::vector<uint32_t>{}, 0).ok());   // offset 2, 1 token
  REQUIRE((*w)->Finish().ok());
  REQUIRE(Dataset::Open(dir).ok());
  auto patch = [&](const std::string& file, std::streamoff at, const void* bytes, size_t n) {
    std::fstream f(dir + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at);
    f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  };
  // Record 0: input 0xffffffff + target 3 wraps to 2 in 32 bits, so record
  // 1's offset 2 and the total of 3 tokens would still add up.
  const uint32_t huge[2] = {0xffffffffu, 3};
  patch("index.bin", 32 + 8, huge, sizeof(huge));
  auto opened = Dataset::Open(dir);
  CHECK(opened.status().code() == absl::StatusCode::kDataLoss);
  CHECK(opened.status().message().find("index record 0") != std::string::npos);
  // A sample count whose size in bytes wraps to the file's: 24 * (2 + 2^61)
  // is 48 modulo 2^64. With dataset.pbtxt agreeing, the old check let it
  // through and the record loop ran past the mapping.
  const uint32_t sane[2] = {1, 1};
  patch("index.bin", 32 + 8, sane, sizeof(sane));
  REQUIRE(Dataset::Open(dir).ok());
  const uint64_t count = 2 + (uint64_t{1} << 61);
  patch("index.bin", 16, &count, sizeof(count));
  std::string text;
  {
    std::ifstream in(dir + "/dataset.pbtxt");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("num_samples: 2");
  REQUIRE(at != std::string::npos);
  text.replace(at, 14, "num_samples: " + std::to_string(count));
  std::ofstream(dir + "/dataset.pbtxt", std::ios::trunc) << text;
  auto wrapped = Dataset::Open(dir);
  CHECK(wrapped.status().code() == absl::StatusCode::kDataLoss);
  CHECK(wrapped.status().message().find("sample count") != std::string::npos);
}

TEST_CASE("A FIFO, a device or a directory in place of a dataset file is refused without blocking") {
  const std::string dir = testing::FreshTempDir("special");
  proto::DatasetInfo info;
  info.set_vocab(10);
  info.add_tasks("a");
  auto w = DatasetWriter::Create(dir, info);
  REQUIRE((*w)->Add(std::vector<uint32_t>{1, 2}, std::vector<uint32_t>{3}, 0).ok());
  REQUIRE((*w)->Finish().ok());
  REQUIRE(Dataset::Open(dir).ok());
  for (const char* file : {"index.bin", "tokens.bin"}) {
    INFO(file);
    const std::string path = dir + "/" + file;
    std::filesystem::rename(path, path + ".real");
    // Before: open() of the FIFO waited for a writer forever (a planner's
    // Submit handler blocked with it); /dev/zero mapped as an empty file.
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    CHECK(Dataset::Open(dir).status().code() == absl::StatusCode::kInvalidArgument);
    std::filesystem::remove(path);
    std::filesystem::create_symlink("/dev/zero", path);
    CHECK(Dataset::Open(dir).status().code() == absl::StatusCode::kInvalidArgument);
    std::filesystem::remove(path);
    std::filesystem::create_directory(path);
    CHECK(Dataset::Open(dir).status().code() == absl::StatusCode::kInvalidArgument);
    std::filesystem::remove(path);
    std::filesystem::rename(path + ".real", path);
    REQUIRE(Dataset::Open(dir).ok());
  }
}

TEST_CASE("A dataset.pbtxt that disagrees with index.bin on tokens, format or vocabulary is DATA_LOSS") {
  const std::string dir = testing::FreshTempDir("pbtxt");
  proto::DatasetInfo info;
  info.set_vocab(10);
  info.add_tasks("a");
  auto w = DatasetWriter::Create(dir, info);
  REQUIRE((*w)->Add(std::vector<uint32_t>{1, 2}, std::vector<uint32_t>{3}, 0).ok());
  REQUIRE((*w)->Finish().ok());
  std::string text;
  {
    std::ifstream in(dir + "/dataset.pbtxt");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(Dataset::Open(dir).ok());
  // Before: only num_samples was compared; the others were taken as written.
  for (const auto& [field, value] : {std::pair{"num_tokens", "4"}, {"format_version", "2"}, {"vocab", "0"}}) {
    INFO(field << ": " << value);
    const std::string lines = "\n" + text;
    const size_t at = lines.find(std::string("\n") + field + ": ");
    REQUIRE(at != std::string::npos);
    const size_t end = lines.find('\n', at + 1);
    std::ofstream(dir + "/dataset.pbtxt", std::ios::trunc)
        << lines.substr(1, at) << field << ": " << value << lines.substr(end);
    const auto opened = Dataset::Open(dir);
    CHECK(opened.status().code() == absl::StatusCode::kDataLoss);
    CHECK(opened.status().message().find("dataset.pbtxt") != std::string::npos);
  }
  std::ofstream(dir + "/dataset.pbtxt", std::ios::trunc) << text;
  CHECK(Dataset::Open(dir).ok());
}

TEST_CASE("Synthetic samples follow the given lengths and their task's rule") {
  const std::string dir = testing::FreshTempDir("synth");
  SynthOptions o;
  o.seed = 5;
  std::vector<data::RawLength> lengths;
  for (int i = 0; i < 400; ++i) lengths.push_back({1 + i % 300, 1 + i % 20});
  auto w = DatasetWriter::Create(dir, SynthInfo(o));
  REQUIRE(w.ok());
  REQUIRE(Synthesize(lengths, o, w->get()).ok());
  REQUIRE((*w)->Finish().ok());
  auto d = Dataset::Open(dir);
  REQUIRE(d.ok());
  REQUIRE((*d)->size() == 400);
  int per_task[kNumSynthTasks] = {};
  for (uint64_t i = 0; i < 400; ++i) {
    const SampleView s = (*d)->sample(i);
    const int task = static_cast<int>(s.task);
    ++per_task[task];
    CHECK(s.input[0] == kFirstTask + s.task);
    CHECK(static_cast<int64_t>(s.input.size()) == std::max<int64_t>(4, lengths[i].input));
    CHECK(s.input.back() == kSep);
    CHECK(std::count(s.input.begin(), s.input.end(), kMark) == 1);
    const int t = static_cast<int>(s.target.size()) - 1;
    CHECK(s.target.back() == kEos);
    CHECK(std::vector<uint32_t>(s.target.begin(), s.target.end()) == SynthTarget(task, s.input, o));
    if (task != 3) CHECK(t == std::min<int64_t>(lengths[i].target, s.input.size() - 3));
  }
  for (int n : per_task) CHECK(n > 50);
  // Spot-check the rules themselves on a hand-made input.
  const uint32_t a = kFirstTask + kNumSynthTasks;  // first symbol
  const std::vector<uint32_t> in = {kFirstTask, a + 2, a, a + 1, kMark, a + 3, a + 5, kSep};
  CHECK(SynthTarget(0, in, o) == std::vector<uint32_t>{a + 2, a, a + 1, kEos});
  CHECK(SynthTarget(1, in, o) == std::vector<uint32_t>{a + 5, a + 3, kEos});
  CHECK(SynthTarget(2, in, o) == std::vector<uint32_t>{a, a + 1, a + 2, kEos});
  CHECK(SynthTarget(3, in, o) == std::vector<uint32_t>{a + (2 + 0 + 1 + 3 + 5) % 32, kEos});
}

}  // namespace
}  // namespace dynapipe::data
