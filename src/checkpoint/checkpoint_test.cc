#include "src/checkpoint/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "src/common/file_util.h"
#include "src/testing/temp_dir.h"
#include "src/spec/normalized_for_test.h"

namespace dynapipe::checkpoint {
namespace {

using Catch::Matchers::Contains;

// Values whose bits must survive exactly: signed zero, NaN payloads,
// infinities, subnormals, extremes.
std::vector<float> Awkward(size_t n, uint32_t seed) {
  std::vector<float> v = {-0.0f,
                          std::bit_cast<float>(0x7fc00123u),  // quiet NaN with a payload
                          std::bit_cast<float>(0xffa00001u),  // negative NaN
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest()};
  uint32_t x = seed * 2654435761u + 1;
  while (v.size() < n) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v.push_back(std::bit_cast<float>(x));
  }
  v.resize(n);
  return v;
}

bool SameBits(const std::vector<float>& a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Buffers {
  // Odd sizes: the float data does not end on an 8-byte word.
  std::vector<float> w = Awkward(1001, 1), b = Awkward(3, 2), m = Awkward(1001, 3), v = Awkward(1001, 4);
  std::vector<float> empty;

  ShardRef Ref(int64_t iteration, int rank, int world) const {
    ShardRef s;
    s.iteration = iteration;
    s.rank = rank;
    s.pp_rank = rank % 2;
    s.dp_rank = rank / 2;
    s.world = world;
    s.optimizer_step = iteration + 1;
    s.job_fingerprint = 0xfedcba9876543210ULL;
    s.params = {{"layers.0.w", w}, {"layers.0.b", b}, {"layers.0.unused", empty}};
    s.adam_m = {{"layers.0.w", m}};
    s.adam_v = {{"layers.0.w", v}};
    return s;
  }
};

std::string Bytes(const std::string& path) { return *ReadFile(path); }
void Put(const std::string& path, const std::string& bytes) { REQUIRE(WriteFileAtomic(path, bytes).ok()); }

TEST_CASE("A shard round-trips bit-exactly, metadata included") {
  const std::string dir = testing::FreshTempDir("roundtrip");
  const Buffers buf;
  REQUIRE(WriteShard(dir, buf.Ref(7, 3, 4)).ok());
  CHECK(std::filesystem::is_regular_file(dir + "/iter-00000007/rank-00003.ckpt"));
  CHECK(ShardPath(dir, 7, 3) == dir + "/iter-00000007/rank-00003.ckpt");

  auto got = ReadShard(dir, 7, 3);
  REQUIRE(got.ok());
  CHECK(got->iteration == 7);
  CHECK(got->rank == 3);
  CHECK(got->pp_rank == 1);
  CHECK(got->dp_rank == 1);
  CHECK(got->world == 4);
  CHECK(got->optimizer_step == 8);
  CHECK(got->job_fingerprint == 0xfedcba9876543210ULL);
  REQUIRE(got->params.size() == 3);
  CHECK(got->params[0].name == "layers.0.w");
  CHECK(SameBits(got->params[0].data, buf.w));
  CHECK(got->params[1].name == "layers.0.b");
  CHECK(SameBits(got->params[1].data, buf.b));
  CHECK(got->params[2].name == "layers.0.unused");
  CHECK(got->params[2].data.empty());
  REQUIRE(got->adam_m.size() == 1);
  CHECK(SameBits(got->adam_m[0].data, buf.m));
  REQUIRE(got->adam_v.size() == 1);
  CHECK(SameBits(got->adam_v[0].data, buf.v));
  CHECK(std::isnan(got->params[0].data[1]));

  // Rewriting the same iteration replaces the shard whole.
  Buffers other;
  other.w.assign(5, 1.5f);
  REQUIRE(WriteShard(dir, other.Ref(7, 3, 4)).ok());
  got = ReadShard(dir, 7, 3);
  REQUIRE(got.ok());
  CHECK(got->params[0].data == std::vector<float>(5, 1.5f));
  for (const auto& e : std::filesystem::directory_iterator(dir + "/iter-00000007")) {
    CHECK(e.path().filename() == "rank-00003.ckpt");  // no temporary left behind
  }
}

TEST_CASE("A write cancelled part way leaves the shard that was there, whole, and no temporary") {
  const std::string dir = testing::FreshTempDir("cancelled");
  const Buffers buf;
  REQUIRE(WriteShard(dir, buf.Ref(4, 0, 1)).ok());
  // 40 MiB in one tensor: written in three pieces, hashed across them.
  std::vector<float> big = Awkward(10u << 20, 9);
  ShardRef large = buf.Ref(4, 0, 1);
  large.params[0].data = big;
  int asked = 0;
  SECTION("cancelled after the first piece") {
    const absl::Status s = WriteShard(dir, large, [&] { return ++asked > 2; });
    CHECK(s.code() == absl::StatusCode::kCancelled);
    CHECK_THAT(std::string(s.message()), Contains("rank-00000.ckpt"));
    auto got = ReadShard(dir, 4, 0);
    REQUIRE(got.ok());
    CHECK(SameBits(got->params[0].data, buf.w));  // the old shard, untouched
  }
  SECTION("cancelled after the last byte, before the rename") {
    int pieces = 0;
    REQUIRE(WriteShard(testing::FreshTempDir("count"), large, [&] { return ++pieces < 0; }).ok());
    const absl::Status s = WriteShard(dir, large, [&] { return ++asked >= pieces; });
    CHECK(s.code() == absl::StatusCode::kCancelled);
    auto got = ReadShard(dir, 4, 0);
    REQUIRE(got.ok());
    CHECK(SameBits(got->params[0].data, buf.w));
  }
  SECTION("never cancelled: written whole") {
    REQUIRE(WriteShard(dir, large, [&] { return ++asked < 0; }).ok());
    CHECK(asked >= 4);  // asked per piece, not once
    auto got = ReadShard(dir, 4, 0);
    REQUIRE(got.ok());
    CHECK(SameBits(got->params[0].data, big));
  }
  for (const auto& e : std::filesystem::directory_iterator(dir + "/iter-00000004")) {
    CHECK(e.path().filename() == "rank-00000.ckpt");
  }
}

TEST_CASE("A missing shard is NOT_FOUND and names the file") {
  const std::string dir = testing::FreshTempDir("missing");
  auto got = ReadShard(dir, 5, 0);
  CHECK(got.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(got.status().message()), Contains("iter-00000005/rank-00000.ckpt"));
  const Buffers buf;
  REQUIRE(WriteShard(dir, buf.Ref(5, 0, 2)).ok());
  CHECK(ReadShard(dir, 5, 1).status().code() == absl::StatusCode::kNotFound);
  CHECK(ReadShard(dir, 6, 0).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("Truncated shards are DATA_LOSS naming the file, wherever they end") {
  const std::string dir = testing::FreshTempDir("truncated");
  const Buffers buf;
  REQUIRE(WriteShard(dir, buf.Ref(2, 1, 2)).ok());
  const std::string path = ShardPath(dir, 2, 1);
  const std::string good = Bytes(path);
  for (size_t keep :
       {size_t{0}, size_t{5}, size_t{11}, size_t{20}, good.size() / 2, good.size() - 9, good.size() - 1}) {
    INFO("kept " << keep << " of " << good.size() << " bytes");
    Put(path, good.substr(0, keep));
    auto got = ReadShard(dir, 2, 1);
    CHECK(got.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(got.status().message()), Contains(path));
  }
  Put(path, good + "x");  // trailing garbage is corruption too
  CHECK(ReadShard(dir, 2, 1).status().code() == absl::StatusCode::kDataLoss);
  Put(path, good);
  CHECK(ReadShard(dir, 2, 1).ok());
}

TEST_CASE("Any flipped bit anywhere in a shard is DATA_LOSS") {
  const std::string dir = testing::FreshTempDir("flipped");
  ShardRef small;
  small.iteration = 1;
  small.rank = 0;
  small.world = 1;
  small.job_fingerprint = 42;
  const std::vector<float> w = Awkward(7, 9), m = Awkward(7, 10);
  small.params = {{"w", w}};
  small.adam_m = {{"w", m}};
  REQUIRE(WriteShard(dir, small).ok());
  const std::string path = ShardPath(dir, 1, 0);
  const std::string good = Bytes(path);
  int checked = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit : {0, 5}) {
      std::string bad = good;
      bad[i] ^= static_cast<char>(1 << bit);
      Put(path, bad);
      auto got = ReadShard(dir, 1, 0);
      INFO("byte " << i << " bit " << bit << " of " << good.size());
      CHECK(got.status().code() == absl::StatusCode::kDataLoss);
      CHECK_THAT(std::string(got.status().message()), Contains(path));
      ++checked;
    }
  }
  CHECK(checked > 100);
  // A checksum mismatch says so.
  std::string bad = good;
  bad[good.size() - 20] ^= 0x01;  // inside the float data
  Put(path, bad);
  CHECK_THAT(std::string(ReadShard(dir, 1, 0).status().message()), Contains("checksum"));
}

TEST_CASE("A shard under another iteration's or rank's name is DATA_LOSS") {
  const std::string dir = testing::FreshTempDir("moved");
  const Buffers buf;
  REQUIRE(WriteShard(dir, buf.Ref(3, 0, 2)).ok());
  std::filesystem::create_directories(dir + "/iter-00000004");
  Put(ShardPath(dir, 3, 1), Bytes(ShardPath(dir, 3, 0)));
  Put(ShardPath(dir, 4, 0), Bytes(ShardPath(dir, 3, 0)));
  CHECK(ReadShard(dir, 3, 1).status().code() == absl::StatusCode::kDataLoss);
  CHECK(ReadShard(dir, 4, 0).status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("A FIFO, a device or a directory in place of a shard is DATA_LOSS, without blocking") {
  const std::string dir = testing::FreshTempDir("special");
  std::filesystem::create_directories(dir + "/iter-00000003");
  const std::string path = ShardPath(dir, 3, 0);
  // Before: open() of the FIFO waited for a writer forever (`dynapipe eval`
  // hung, as would an executor resuming from it).
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  auto fifo = ReadShard(dir, 3, 0);
  CHECK(fifo.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(fifo.status().message()), Contains("not a regular file"));
  std::filesystem::remove(path);
  std::filesystem::create_symlink("/dev/zero", path);
  CHECK(ReadShard(dir, 3, 0).status().code() == absl::StatusCode::kDataLoss);
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  CHECK(ReadShard(dir, 3, 0).status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("A checkpoint dir that cannot name a directory is INVALID_ARGUMENT, not UNAVAILABLE that callers retry") {
  const std::string dir = testing::FreshTempDir("unnamable");
  std::filesystem::create_directories(dir);
  // Before: ENAMETOOLONG and ELOOP were UNAVAILABLE, so `dynapipe submit` of a
  // job naming such a checkpoint.dir retried until its deadline.
  CHECK(LatestCompleteOnDisk(dir + "/" + std::string(300, 'c'), 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  std::filesystem::create_symlink(dir + "/loop", dir + "/loop");
  CHECK(LatestCompleteOnDisk(dir + "/loop", 1).status().code() == absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/file") << "x";
  CHECK(LatestCompleteOnDisk(dir + "/file", 1).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A shard listing a tensor twice is DATA_LOSS") {
  const std::string dir = testing::FreshTempDir("twice");
  const Buffers buf;
  // Before: both copies were returned and readers kept whichever came last
  // (Checkpointer::Restore by name, `dynapipe eval` in order), silently.
  ShardRef s = buf.Ref(2, 0, 1);
  s.params.push_back({"layers.0.w", buf.m});
  REQUIRE(WriteShard(dir, s).ok());
  auto got = ReadShard(dir, 2, 0);
  CHECK(got.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(got.status().message()), Contains("layers.0.w") && Contains("listed twice"));
  s = buf.Ref(2, 0, 1);
  s.adam_v.push_back(s.adam_v.front());
  REQUIRE(WriteShard(dir, s).ok());
  CHECK(ReadShard(dir, 2, 0).status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(WriteShard(dir, buf.Ref(2, 0, 1)).ok());
  CHECK(ReadShard(dir, 2, 0).ok());
}

TEST_CASE("WriteShard refuses impossible shards") {
  const std::string dir = testing::FreshTempDir("invalid");
  const Buffers buf;
  CHECK(WriteShard(dir, buf.Ref(1, 2, 2)).code() == absl::StatusCode::kInvalidArgument);
  CHECK(WriteShard(dir, buf.Ref(-1, 0, 2)).code() == absl::StatusCode::kInvalidArgument);
  CHECK(WriteShard("", buf.Ref(1, 0, 2)).code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("LatestCompleteOnDisk: the newest iteration with every rank's shard; temporaries and strays ignored") {
  const std::string dir = testing::FreshTempDir("latest");
  CHECK(*LatestCompleteOnDisk(dir, 2) == -1);  // no directory yet
  CHECK(LatestCompleteOnDisk(dir, 0).status().code() == absl::StatusCode::kInvalidArgument);
  const Buffers buf;
  for (int64_t it : {2, 4}) {
    for (int r = 0; r < 2; ++r) REQUIRE(WriteShard(dir, buf.Ref(it, r, 2)).ok());
  }
  CHECK(*LatestCompleteOnDisk(dir, 2) == 4);
  // Iteration 6: rank 1 died while writing; its temporary file was left behind.
  REQUIRE(WriteShard(dir, buf.Ref(6, 0, 2)).ok());
  Put(dir + "/iter-00000006/rank-00001.ckpt.tmp.12345", "partial");
  // Iteration 8: only rank 1, plus a shard of a rank outside the world.
  REQUIRE(WriteShard(dir, buf.Ref(8, 1, 2)).ok());
  REQUIRE(WriteShard(dir, buf.Ref(8, 5, 6)).ok());
  // Strays that look almost right.
  std::filesystem::create_directories(dir + "/iter-abc");
  std::filesystem::create_directories(dir + "/iter-00000009.tmp");
  Put(dir + "/iter-00000010", "a file, not a directory");
  Put(dir + "/notes.txt", "x");
  CHECK(*LatestCompleteOnDisk(dir, 2) == 4);
  CHECK(ReadShard(dir, 6, 0).ok());  // the temporary beside it does not disturb reading
  CHECK(ReadShard(dir, 6, 1).status().code() == absl::StatusCode::kNotFound);
  CHECK(*LatestCompleteOnDisk(dir, 1) == 6);  // world 1: rank 0 alone completes 6

  // Rank 1 retries and finishes: 6 becomes the latest complete one.
  REQUIRE(WriteShard(dir, buf.Ref(6, 1, 2)).ok());
  CHECK(*LatestCompleteOnDisk(dir, 2) == 6);
}

TEST_CASE("JobFingerprint tells models and layouts apart; CheckSameJob names the difference") {
  proto::JobSpec spec;
  spec.mutable_model()->set_name("gpt");
  spec.mutable_model()->set_num_layers(4);
  spec.mutable_model()->set_hidden(64);
  spec.mutable_model()->set_kind(proto::ModelKind::gpt);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_vocab(100);
  spec.mutable_parallelism()->set_pp(2);
  spec.mutable_dataset()->set_path("data");
  spec.set_iterations(10);
  spec.mutable_cluster()->mutable_device()->set_peak_tflops(1);
  spec.mutable_cluster()->mutable_device()->set_memory_bandwidth_gbps(1);
  spec.mutable_cluster()->mutable_device()->set_memory_mb(1000);
  spec.mutable_cluster()->set_devices_per_node(8);  // room for every layout below
  const uint64_t base = JobFingerprint(spec::NormalizedForTest(spec));
  proto::JobSpec same = spec;
  same.mutable_model()->set_name("renamed");
  same.mutable_model()->set_ffn(256);  // the default, spelled out
  same.set_iterations(1000);
  same.mutable_checkpoint()->set_dir("/elsewhere");
  CHECK(JobFingerprint(spec::NormalizedForTest(same)) == base);
  proto::JobSpec dp1 = spec;
  dp1.mutable_parallelism()->set_dp(1);  // dp 0 means 1
  CHECK(JobFingerprint(spec::NormalizedForTest(dp1)) == base);
  for (bool zero1 : {false, true}) {  // buckets do not decide what a rank keeps
    proto::JobSpec a = spec, b = spec;
    a.mutable_optimizer()->set_zero1(zero1);
    b.mutable_optimizer()->set_zero1(zero1);
    b.mutable_parallelism()->set_grad_bucket_mb(0.5);
    CHECK(JobFingerprint(spec::NormalizedForTest(a)) == JobFingerprint(spec::NormalizedForTest(b)));
  }
  for (auto change : std::vector<std::function<void(proto::JobSpec*)>>{
           [](proto::JobSpec* s) { s->mutable_model()->set_hidden(128); },
           [](proto::JobSpec* s) { s->mutable_model()->set_num_layers(5); },
           [](proto::JobSpec* s) { s->mutable_parallelism()->set_pp(4); },
           [](proto::JobSpec* s) { s->mutable_parallelism()->set_dp(2); },
           [](proto::JobSpec* s) { s->mutable_optimizer()->set_zero1(true); },
       }) {
    proto::JobSpec other = spec;
    change(&other);
    CHECK(JobFingerprint(spec::NormalizedForTest(other)) != base);
  }

  ShardInfo want;
  want.job_fingerprint = base;
  want.world = 4;
  want.rank = 1;
  want.pp_rank = 1;
  ShardInfo got = want;
  CHECK(CheckSameJob(want, got).ok());
  got.job_fingerprint = base + 1;
  CHECK(CheckSameJob(want, got).code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(CheckSameJob(want, got).message()), Contains("job_fingerprint"));
  got = want;
  got.world = 8;
  CHECK_THAT(std::string(CheckSameJob(want, got).message()), Contains("world"));
}

}  // namespace
}  // namespace dynapipe::checkpoint
