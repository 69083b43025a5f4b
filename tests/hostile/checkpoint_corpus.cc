#include "tests/hostile/checkpoint_corpus.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "src/checkpoint/checkpoint.h"
#include "src/data/dataset.h"
#include "cli/evaluate.h"
#include "runtime/memory/buffer_pool.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"
#include "tests/hostile/data_root.h"
#include "src/spec/normalized_for_test.h"

namespace dynapipe::testing::hostile {
namespace {

namespace fs = std::filesystem;
using checkpoint::ShardPath;
using checkpoint::TensorRef;

proto::JobSpec EvalJob(const std::string& data, int hidden) {
  proto::JobSpec s;
  s.set_name("hostile-eval");
  auto* m = s.mutable_model();
  m->set_kind(proto::ModelKind::gpt);
  m->set_num_layers(2);
  m->set_hidden(hidden);
  m->set_heads(4);
  m->set_ffn(2 * hidden);
  m->set_vocab(16);
  m->set_max_positions(64);
  m->set_dtype(proto::DType::fp32);
  m->set_tie_embeddings(true);
  s.mutable_parallelism()->set_pp(1);
  s.mutable_parallelism()->set_dp(1);
  s.mutable_dataset()->set_path(data);
  s.mutable_dataset()->set_format(proto::DatasetSpec::indexed);
  s.mutable_batching()->set_global_batch_tokens(600);
  s.mutable_batching()->set_max_seq_len(64);
  s.set_iterations(10);
  s.set_seed(3);
  auto* c = s.mutable_cluster();
  c->mutable_device()->set_peak_tflops(0.05);
  c->mutable_device()->set_memory_bandwidth_gbps(10);
  c->mutable_device()->set_memory_mb(4096);
  return s;
}

absl::Status WriteDataset(const std::string& dir, uint32_t max_token) {
  proto::DatasetInfo info;
  info.set_vocab(max_token + 1);
  info.add_tasks("t0");
  ASSIGN_OR_RETURN(auto w, data::DatasetWriter::Create(dir, info));
  std::mt19937 rng(5);
  for (int i = 0; i < 24; ++i) {
    std::vector<uint32_t> in(4 + rng() % 20), out(1 + rng() % 4);
    for (auto& t : in) t = 3 + rng() % 13;
    for (auto& t : out) t = 3 + rng() % 13;
    if (i == 0) in[0] = max_token;
    RETURN_IF_ERROR(w->Add(in, out, 0));
  }
  return w->Finish();
}

// The model's initial parameters as one rank's shard, after `edit`.
absl::Status WriteModelShard(const proto::JobSpec& spec, const std::string& dir, int64_t iteration, int rank,
                             int world, const std::function<void(std::vector<TensorRef>*)>& edit = {}) {
  runtime::BufferPool pool(runtime::CpuAllocator());
  ASSIGN_OR_RETURN(auto whole, cli::LoadWholeModel(spec, "", -1, &pool));
  std::vector<TensorRef> params;
  const std::span<const float> data = std::as_const(*whole).param_data();
  for (const auto& p : whole->layout().params()) params.push_back({p.name, data.subspan(p.offset, p.size)});
  if (edit) edit(&params);
  checkpoint::ShardRef shard;
  shard.iteration = iteration;
  shard.rank = rank;
  shard.world = world;
  shard.job_fingerprint = checkpoint::JobFingerprint(spec::NormalizedForTest(spec));
  shard.params = params;
  shard.adam_m = params;
  shard.adam_v = params;
  return checkpoint::WriteShard(dir, shard);
}

template <typename T>
void Put(std::string* bytes, size_t at, T value) {
  std::memcpy(bytes->data() + at, &value, sizeof(T));
}

}  // namespace

absl::StatusOr<CheckpointCorpus> MakeCheckpointCorpus(const std::string& dir) {
  CheckpointCorpus c;
  std::error_code ec;
  fs::create_directories(dir, ec);
  c.data = dir + "/data";
  c.bad_vocab_data = dir + "/data-bad-vocab";
  RETURN_IF_ERROR(WriteDataset(c.data, 15));
  RETURN_IF_ERROR(WriteDataset(c.bad_vocab_data, 1u << 30));  // claims vocab 2^30 + 1: ids the model cannot embed
  const proto::JobSpec spec = EvalJob(c.data, 32);
  c.job = dir + "/eval-job.pbtxt";
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  RETURN_IF_ERROR(WriteFileAtomic(c.job, text));

  c.valid_dir = dir + "/valid";
  RETURN_IF_ERROR(WriteModelShard(spec, c.valid_dir, kEvalIteration, 0, 1));
  ASSIGN_OR_RETURN(const std::string shard, ReadFile(ShardPath(c.valid_dir, kEvalIteration, 0)));
  uint32_t header_len;
  std::memcpy(&header_len, shard.data() + 8, 4);
  const size_t data_start = (12 + header_len + 7) / 8 * 8;
  const size_t size = shard.size();

  int next = 0;
  auto case_dir = [&](const std::string& name) {
    ShardCase s{name, absl::StrCat(dir, "/bad-", next++)};
    fs::create_directories(fs::path(ShardPath(s.dir, kEvalIteration, 0)).parent_path(), ec);
    c.bad.push_back(s);
    return s;
  };
  auto bytes = [&](const std::string& name, std::string b) -> absl::Status {
    return WriteFileAtomic(ShardPath(case_dir(name).dir, kEvalIteration, 0), b);
  };
  auto flip = [&](size_t at, const std::string& where) {
    std::string b = shard;
    b[at] = static_cast<char>(b[at] ^ 0x5a);
    return bytes(absl::StrCat("byte ", at, " of ", size, " flipped (", where, ")"), b);
  };
  RETURN_IF_ERROR(flip(0, "magic"));
  RETURN_IF_ERROR(flip(7, "format version"));
  RETURN_IF_ERROR(flip(8, "header length"));
  RETURN_IF_ERROR(flip(11, "header length, high byte"));
  RETURN_IF_ERROR(flip(12, "header"));
  RETURN_IF_ERROR(flip(12 + header_len / 2, "header"));
  RETURN_IF_ERROR(flip(12 + header_len - 1, "header"));
  if (data_start > 12 + header_len) RETURN_IF_ERROR(flip(data_start - 1, "padding"));
  RETURN_IF_ERROR(flip(data_start, "first float"));
  RETURN_IF_ERROR(flip(data_start + (size - 8 - data_start) / 2, "params / moments"));
  RETURN_IF_ERROR(flip(size - 9, "last float"));
  RETURN_IF_ERROR(flip(size - 8, "checksum"));
  RETURN_IF_ERROR(flip(size - 1, "checksum"));
  for (size_t n : {size_t{0}, size_t{4}, size_t{8}, size_t{11}, size_t{12}, size_t{12} + header_len - 1, data_start,
                   size / 2, size - 8, size - 1}) {
    RETURN_IF_ERROR(bytes(absl::StrCat("truncated to ", n, " of ", size, " bytes"), shard.substr(0, n)));
  }
  for (size_t n : {1, 8, 4096}) RETURN_IF_ERROR(bytes(absl::StrCat(n, " trailing bytes"), shard + std::string(n, '\0')));
  for (const auto& [len, what] : std::vector<std::pair<uint32_t, std::string>>{
           {0xffffffffu, "2^32-1"}, {0, "0"}, {header_len + 1, "one too many"}, {static_cast<uint32_t>(size), "the file size"},
           {64u << 20, "64 MiB"}}) {
    std::string b = shard;
    Put<uint32_t>(&b, 8, len);
    RETURN_IF_ERROR(bytes("header length " + what, b));
  }
  {
    std::string b = shard;
    std::memcpy(b.data(), "DPCKPT02", 8);
    RETURN_IF_ERROR(bytes("magic DPCKPT02 (another format version)", b));
  }
  RETURN_IF_ERROR(bytes("300 random bytes", RandomBytes(300, 31)));
  RETURN_IF_ERROR(bytes("magic, then random bytes", shard.substr(0, 8) + RandomBytes(4000, 32)));
  {
    std::string b = shard;  // header bytes replaced: the checksum is valid for nothing
    for (size_t i = 12; i < 12 + header_len; ++i) b[i] = static_cast<char>(0xff);
    RETURN_IF_ERROR(bytes("header bytes all 0xff", b));
  }

  // Well-formed shards that do not belong where they are.
  const std::string tmp = dir + "/tmp";
  RETURN_IF_ERROR(WriteModelShard(spec, tmp, kEvalIteration + 1, 0, 1));
  ASSIGN_OR_RETURN(std::string other, ReadFile(ShardPath(tmp, kEvalIteration + 1, 0)));
  RETURN_IF_ERROR(bytes("a shard of iteration 6 at iteration 5's path", other));
  RETURN_IF_ERROR(WriteModelShard(spec, tmp, kEvalIteration, 1, 2));
  ASSIGN_OR_RETURN(other, ReadFile(ShardPath(tmp, kEvalIteration, 1)));
  RETURN_IF_ERROR(bytes("a shard of rank 1 at rank 0's path", other));
  auto shard_case = [&](const std::string& name, const proto::JobSpec& s,
                        const std::function<void(std::vector<TensorRef>*)>& edit) {
    return WriteModelShard(s, case_dir(name).dir, kEvalIteration, 0, 1, edit);
  };
  RETURN_IF_ERROR(shard_case("a tensor one float short", spec, [](auto* t) { t->back().data = t->back().data.first(t->back().data.size() - 1); }));
  RETURN_IF_ERROR(shard_case("a tensor missing", spec, [](auto* t) { t->pop_back(); }));
  RETURN_IF_ERROR(shard_case("an unknown tensor", spec, [](auto* t) { t->push_back({"h.99.bogus", t->front().data}); }));
  RETURN_IF_ERROR(shard_case("a tensor named twice", spec, [](auto* t) { t->push_back(t->front()); }));
  RETURN_IF_ERROR(shard_case("a tensor with an empty name", spec, [](auto* t) { t->front().name = ""; }));
  RETURN_IF_ERROR(shard_case("another model's shard (hidden 64)", EvalJob(c.data, 64), {}));

  // Files that are not shards.
  auto special = [&](const std::string& name, const std::function<absl::Status(const std::string&)>& make) {
    return make(ShardPath(case_dir(name).dir, kEvalIteration, 0));
  };
  RETURN_IF_ERROR(special("the shard is a FIFO", [](const std::string& p) {
    return ::mkfifo(p.c_str(), 0600) == 0 ? absl::OkStatus() : absl::InternalError("mkfifo");
  }));
  RETURN_IF_ERROR(special("the shard is a directory", [&](const std::string& p) {
    fs::create_directory(p, ec);
    return absl::OkStatus();
  }));
  for (const char* target : {"/dev/zero", "/dev/urandom", "/nonexistent-hostile/x"}) {
    RETURN_IF_ERROR(special(absl::StrCat("the shard is a link to ", target), [&](const std::string& p) {
      fs::create_symlink(target, p, ec);
      return absl::OkStatus();
    }));
  }
  RETURN_IF_ERROR(special("the shard is a symlink loop", [&](const std::string& p) {
    fs::create_symlink(p, p, ec);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(special("the shard is a sparse 2 GiB file", [&](const std::string& p) -> absl::Status {
    RETURN_IF_ERROR(WriteFileAtomic(p, shard.substr(0, 12)));
    return ::truncate(p.c_str(), off_t{2} << 30) == 0 ? absl::OkStatus() : absl::InternalError("truncate");
  }));
  c.bad.push_back({"no such checkpoint directory", dir + "/does-not-exist"});
  ShardCase empty = case_dir("the iteration's directory holds no shard");
  fs::remove(ShardPath(empty.dir, kEvalIteration, 0), ec);
  return c;
}

}  // namespace dynapipe::testing::hostile
