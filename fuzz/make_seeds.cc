// Writes the seed corpus of every harness (fuzz/corpus/<harness>/) with the
// project's own code: job specs from configs/jobs in text and JSON, lengths
// from tests/data, datasets from the synthetic generator, shards from
// WriteShard, plans from the planner, HTTP request heads as clients send them. Beside the valid seeds sit
// near-valid ones (one field or byte off) that the parsers must reject.
//
//   bazel run //fuzz:make_seeds -- fuzz/corpus    (relative to the repository root)
// (or in the fuzz output base, as README.md shows).
// Deterministic: the same tree writes the same bytes.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fuzz/dataset_input.h"
#include "fuzz/plan_set.pb.h"
#include "google/protobuf/text_format.h"
#include "planner/plan/instructions.h"
#include "planner/service/job_runtime.h"
#include "proto/job.pb.h"
#include "src/checkpoint/checkpoint.h"
#include "src/safetensors/safetensors.h"
#include "src/data/dataset.h"
#include "src/data/synth.h"
#include "src/common/file_util.h"
#include "src/plan/plan_seal.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"

namespace dynapipe::fuzz {
namespace {

namespace fs = std::filesystem;

// Where seeds go and where scratch files are made.
struct Dirs {
  std::string root;     // repository root (configs/, tests/data/)
  std::string corpus;   // fuzz/corpus
  std::string scratch;  // removed at the end
};

absl::Status Put(const Dirs& d, const std::string& harness, const std::string& name, const std::string& bytes) {
  const std::string dir = d.corpus + "/" + harness;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("create ", dir, ": ", ec.message()));
  return WriteFileAtomic(dir + "/" + name, bytes);
}

std::string Text(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(m, &out);
  return out;
}

// ---- config: job specs ------------------------------------------------------

absl::Status ConfigSeeds(const Dirs& d) {
  proto::JobSpec quickstart;
  for (const auto& entry : fs::directory_iterator(d.root + "/configs/jobs")) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".pbtxt") continue;
    ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
    proto::JobSpec spec;
    RETURN_IF_ERROR(ParseTextProto(text, path, &spec));
    const std::string stem = entry.path().stem().string();
    RETURN_IF_ERROR(Put(d, "config", stem + ".pbtxt", text));
    RETURN_IF_ERROR(Put(d, "config", stem + ".json", ToJson(spec, /*pretty=*/true)));
    if (stem == "quickstart") quickstart = spec;
  }
  if (quickstart.name().empty()) return absl::NotFoundError("configs/jobs/quickstart.pbtxt");

  // Valid variants that reach other branches of the planner's setup.
  proto::JobSpec t5 = quickstart;
  t5.set_name("t5");
  {
    proto::ModelSpec* m = t5.mutable_model();
    m->set_kind(proto::ModelKind::t5);
    m->set_num_layers(2);
    m->set_num_decoder_layers(2);
  }
  t5.mutable_batching()->set_method(proto::BatchingSpec::padding);
  t5.mutable_batching()->set_micro_batch_size(4);
  RETURN_IF_ERROR(Put(d, "config", "t5-padding.pbtxt", Text(t5)));
  proto::JobSpec interleaved = quickstart;
  interleaved.set_name("interleaved");
  for (int l : {0, 1, 0, 1}) interleaved.mutable_parallelism()->add_layer_to_device(l);
  interleaved.mutable_schedule()->set_policy(proto::ScheduleSpec::interleaved_1f1b);
  interleaved.mutable_batching()->set_method(proto::BatchingSpec::token_based);
  interleaved.mutable_batching()->set_micro_batch_tokens(512);
  RETURN_IF_ERROR(Put(d, "config", "interleaved.json", ToJson(interleaved)));
  proto::JobSpec minimal;
  *minimal.mutable_model() = quickstart.model();
  minimal.set_memory_limit_mb(1000);
  minimal.set_iterations(1);
  minimal.mutable_dataset()->set_path("lengths.txt");
  RETURN_IF_ERROR(Put(d, "config", "minimal.pbtxt", Text(minimal)));

  // Near-valid: each rejected for one field.
  struct Bad {
    const char* name;
    void (*edit)(proto::JobSpec*);
  };
  const Bad bad[] = {
      {"heads-not-dividing", [](proto::JobSpec* s) { s->mutable_model()->set_heads(3); }},
      {"pp-over-layers", [](proto::JobSpec* s) { s->mutable_parallelism()->set_pp(5); }},
      {"negative-dp", [](proto::JobSpec* s) { s->mutable_parallelism()->set_dp(-2); }},
      {"layer-to-device-short", [](proto::JobSpec* s) { s->mutable_parallelism()->add_layer_to_device(1); }},
      {"seq-over-positions", [](proto::JobSpec* s) { s->mutable_batching()->set_max_seq_len(4096); }},
      {"tolerance-over-one", [](proto::JobSpec* s) { s->mutable_batching()->set_cap_tolerance(1.5); }},
      {"permutations-65", [](proto::JobSpec* s) { s->mutable_schedule()->set_permutations(65); }},
      {"no-iterations", [](proto::JobSpec* s) { s->clear_iterations(); }},
      {"resume-without-dir", [](proto::JobSpec* s) { s->mutable_checkpoint()->clear_dir(); }},
      {"batch-under-dp", [](proto::JobSpec* s) { s->mutable_batching()->set_global_batch_tokens(1); }},
  };
  for (const Bad& b : bad) {
    proto::JobSpec s = quickstart;
    b.edit(&s);
    RETURN_IF_ERROR(Put(d, "config", absl::StrCat("bad-", b.name, ".pbtxt"), Text(s)));
  }
  RETURN_IF_ERROR(Put(d, "config", "bad-unknown-field.pbtxt", "name: \"x\"\niters: 5\n"));
  RETURN_IF_ERROR(Put(d, "config", "bad-camel-json.json",
                      "{\"name\": \"x\", \"model\": {\"numLayers\": 2, \"hidden\": 8, \"heads\": 2, \"vocab\": 16,"
                      " \"kind\": \"gpt\"}, \"memoryLimitMb\": \"1e3\", \"iterations\": \"7\", \"bogus\": 1}\n"));
  return absl::OkStatus();
}

// ---- lengths: sample-lengths files -------------------------------------------

absl::Status LengthsSeeds(const Dirs& d) {
  ASSIGN_OR_RETURN(const std::string flan, ReadFile(d.root + "/tests/data/flan-like-lengths.txt"));
  std::string excerpt;
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(flan, '\n')) {
    if (++lines > 120) break;
    absl::StrAppend(&excerpt, line, "\n");
  }
  RETURN_IF_ERROR(Put(d, "lengths", "flan-excerpt.txt", excerpt));
  RETURN_IF_ERROR(Put(d, "lengths", "forms.txt",
                      "# every accepted form\n\n12 3\n7\n5,2\n\t9\t0  # a comment\n  2048 2048\r\n1 0\n"));
  RETURN_IF_ERROR(Put(d, "lengths", "long.txt", "3000 100\n1 5000\n2047 1\n"));
  const std::pair<const char*, const char*> bad[] = {
      {"zero-input", "5 1\n0 3\n"},  {"negative-target", "5 -1\n"},   {"three-fields", "1 2 3\n"},
      {"not-a-number", "12 x\n"},    {"overflow", "99999999999999999999 1\n"},
      {"empty", "# nothing\n\n"},
  };
  for (const auto& [name, text] : bad) RETURN_IF_ERROR(Put(d, "lengths", absl::StrCat("bad-", name, ".txt"), text));
  // Regression: input + target overflowed in planner::Truncate (batching_test.cc).
  RETURN_IF_ERROR(Put(d, "lengths", "regress-int64-max.txt", "9223372036854775807 1\n1 9223372036854775807\n"));
  return absl::OkStatus();
}

// ---- dataset: dataset directories --------------------------------------------

absl::StatusOr<DatasetFiles> Synth(const std::string& dir, std::vector<data::RawLength> lengths, uint64_t seed) {
  data::SynthOptions o;
  o.seed = seed;
  o.alphabet = 8;
  ASSIGN_OR_RETURN(auto writer, data::DatasetWriter::Create(dir, data::SynthInfo(o)));
  RETURN_IF_ERROR(data::Synthesize(lengths, o, writer.get()));
  RETURN_IF_ERROR(writer->Finish());
  DatasetFiles f;
  ASSIGN_OR_RETURN(f.info, ReadFile(dir + "/dataset.pbtxt"));
  ASSIGN_OR_RETURN(f.index, ReadFile(dir + "/index.bin"));
  ASSIGN_OR_RETURN(f.tokens, ReadFile(dir + "/tokens.bin"));
  return f;
}

absl::Status DatasetSeeds(const Dirs& d) {
  ASSIGN_OR_RETURN(const DatasetFiles three, Synth(d.scratch + "/ds3", {{5, 2}, {3, 0}, {7, 3}}, 1));
  ASSIGN_OR_RETURN(const DatasetFiles one, Synth(d.scratch + "/ds1", {{4, 1}}, 2));
  ASSIGN_OR_RETURN(const DatasetFiles many, Synth(d.scratch + "/ds9", {{6, 2}, {9, 1}, {4, 4}, {12, 3}, {5, 0},
                                                                       {8, 2}, {3, 1}, {10, 5}, {6, 1}}, 3));
  RETURN_IF_ERROR(Put(d, "dataset", "three.bin", JoinDatasetInput(three)));
  RETURN_IF_ERROR(Put(d, "dataset", "one.bin", JoinDatasetInput(one)));
  RETURN_IF_ERROR(Put(d, "dataset", "nine.bin", JoinDatasetInput(many)));

  DatasetFiles f = three;
  f.tokens.resize(f.tokens.size() - 4);
  RETURN_IF_ERROR(Put(d, "dataset", "bad-tokens-truncated.bin", JoinDatasetInput(f)));
  f = three;
  f.index[16] = static_cast<char>(f.index[16] + 1);  // sample count
  RETURN_IF_ERROR(Put(d, "dataset", "bad-sample-count.bin", JoinDatasetInput(f)));
  f = three;
  f.index[8] = 2;  // format version
  RETURN_IF_ERROR(Put(d, "dataset", "bad-version.bin", JoinDatasetInput(f)));
  f = three;
  f.index[32 + 24 + 8] = static_cast<char>(0xff);  // second record's input_len
  RETURN_IF_ERROR(Put(d, "dataset", "bad-record-length.bin", JoinDatasetInput(f)));
  f = three;
  f.info = "vocab: 16\n";
  RETURN_IF_ERROR(Put(d, "dataset", "bad-info.bin", JoinDatasetInput(f)));
  return absl::OkStatus();
}

// ---- checkpoint: shard files --------------------------------------------------

// Must match checkpoint_fuzzer.cc.
constexpr int64_t kShardIteration = 3;
constexpr int kShardRank = 1;

absl::StatusOr<std::string> Shard(const std::string& dir, int rank, const std::vector<std::vector<float>>& tensors) {
  checkpoint::ShardRef s;
  s.iteration = kShardIteration;
  s.rank = rank;
  s.world = 2;
  s.pp_rank = rank;
  s.optimizer_step = 4;
  s.job_fingerprint = 0x0123456789abcdefULL;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::span<const float> data(tensors[i]);
    s.params.push_back({absl::StrCat("layer", i, ".w"), data});
    s.adam_m.push_back({absl::StrCat("layer", i, ".w"), data});
    s.adam_v.push_back({absl::StrCat("layer", i, ".w"), data});
  }
  RETURN_IF_ERROR(checkpoint::WriteShard(dir, s));
  return ReadFile(checkpoint::ShardPath(dir, kShardIteration, rank));
}

absl::Status CheckpointSeeds(const Dirs& d) {
  const std::vector<float> w = {0.5f, -1.25f, 3.0f, 0.0f, -0.0f}, b = {1e-8f, 2.0f, -7.5f};
  ASSIGN_OR_RETURN(const std::string two, Shard(d.scratch + "/ckpt-two", kShardRank, {w, b}));
  ASSIGN_OR_RETURN(const std::string empty_tensor, Shard(d.scratch + "/ckpt-empty", kShardRank, {w, {}}));
  ASSIGN_OR_RETURN(const std::string none, Shard(d.scratch + "/ckpt-none", kShardRank, {}));
  ASSIGN_OR_RETURN(const std::string rank0, Shard(d.scratch + "/ckpt-rank0", 0, {b}));
  RETURN_IF_ERROR(Put(d, "checkpoint", "two-tensors.ckpt", two));
  RETURN_IF_ERROR(Put(d, "checkpoint", "empty-tensor.ckpt", empty_tensor));
  RETURN_IF_ERROR(Put(d, "checkpoint", "no-tensors.ckpt", none));
  RETURN_IF_ERROR(Put(d, "checkpoint", "bad-other-rank.ckpt", rank0));
  std::string s = two;
  s[s.size() - 12] = static_cast<char>(s[s.size() - 12] ^ 1);  // a float bit
  RETURN_IF_ERROR(Put(d, "checkpoint", "bad-checksum.ckpt", s));
  RETURN_IF_ERROR(Put(d, "checkpoint", "bad-truncated.ckpt", two.substr(0, two.size() - 1)));
  s = two;
  s[8] = static_cast<char>(s[8] + 40);  // header length
  RETURN_IF_ERROR(Put(d, "checkpoint", "bad-header-length.ckpt", s));
  return absl::OkStatus();
}

// ---- safetensors: weight files -------------------------------------------------

absl::Status SafetensorsSeeds(const Dirs& d) {
  const std::vector<float> w = {0.5f, -1.25f, 3.0f, 0.0f, -0.0f, 7.0f}, b = {1e-8f, 2.0f};
  const uint16_t half[] = {0x3C00, 0xC000, 0x0001};
  using safetensors::TensorOut;
  const std::vector<TensorOut> two = {safetensors::F32Tensor("h.0.attn.c_attn.weight", {2, 3}, w),
                                      safetensors::F32Tensor("h.0.attn.c_attn.bias", {2}, b),
                                      {"half", safetensors::DType::kF16, {3},
                                       {reinterpret_cast<const char*>(half), sizeof(half)}}};
  ASSIGN_OR_RETURN(const std::string ok, safetensors::Serialize(two, {{"format", "pt"}}));
  RETURN_IF_ERROR(Put(d, "safetensors", "two-tensors.safetensors", ok));
  ASSIGN_OR_RETURN(const std::string empty, safetensors::Serialize(std::vector<TensorOut>{}));
  RETURN_IF_ERROR(Put(d, "safetensors", "empty.safetensors", empty));
  std::string s = ok;
  s[0] = static_cast<char>(s[0] + 64);  // header length past the file
  RETURN_IF_ERROR(Put(d, "safetensors", "bad-header-length.safetensors", s));
  RETURN_IF_ERROR(Put(d, "safetensors", "bad-truncated.safetensors", ok.substr(0, ok.size() - 2)));
  s = ok;
  if (const size_t at = s.find("\"F32\""); at != std::string::npos) s[at + 2] = '1';  // unknown dtype F12
  RETURN_IF_ERROR(Put(d, "safetensors", "bad-dtype.safetensors", s));
  s = ok;
  if (const size_t at = s.find("[0,24]"); at != std::string::npos) s[at + 4] = '0';  // [0,20]: shape mismatch
  RETURN_IF_ERROR(Put(d, "safetensors", "bad-offsets.safetensors", s));
  return absl::OkStatus();
}

// ---- plan: stored plans of one iteration -------------------------------------

// Must match plan_fuzzer.cc.
constexpr char kPlanJob[] = "fuzz";
constexpr int64_t kPlanIteration = 3;

absl::StatusOr<PlanSet> Plans(const Dirs& d, proto::JobSpec spec) {
  std::string lengths;
  for (int i = 0; i < 48; ++i) absl::StrAppend(&lengths, 8 + (i * 29) % 90, " ", 1 + i % 12, "\n");
  const std::string path = d.scratch + "/plan-lengths.txt";
  RETURN_IF_ERROR(WriteFileAtomic(path, lengths));
  spec.mutable_dataset()->set_path(path);
  spec.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::NormalizedJobSpec::Normalize(spec));
  ASSIGN_OR_RETURN(auto runtime, planner::service::BuildJobRuntime(normalized, kPlanJob, d.scratch));
  ASSIGN_OR_RETURN(const planner::IterationPlan plan, runtime->planner->Plan(runtime->batch(kPlanIteration), kPlanIteration));
  PlanSet set;
  for (const proto::ExecutionPlan& p : plan.plans) set.add_plans(p.SerializeAsString());
  return set;
}

absl::Status PlanSeeds(const Dirs& d) {
  proto::JobSpec quickstart;
  RETURN_IF_ERROR(LoadProtoFile(d.root + "/configs/jobs/quickstart.pbtxt", &quickstart));
  // The quickstart's measured profile exists only after deploy/quickstart.sh: plan from the analytic model.
  quickstart.clear_cost_profile_path();
  ASSIGN_OR_RETURN(const PlanSet pp2dp2, Plans(d, quickstart));
  RETURN_IF_ERROR(Put(d, "plan", "pp2-dp2.bin", pp2dp2.SerializeAsString()));
  proto::JobSpec s = quickstart;
  s.mutable_parallelism()->set_dp(1);
  s.mutable_batching()->set_method(proto::BatchingSpec::fixed_mbs);
  s.mutable_batching()->set_micro_batch_size(2);
  ASSIGN_OR_RETURN(const PlanSet pp2, Plans(d, s));
  RETURN_IF_ERROR(Put(d, "plan", "pp2-fixed.bin", pp2.SerializeAsString()));
  s = quickstart;
  s.mutable_parallelism()->set_pp(1);
  s.mutable_parallelism()->set_dp(1);
  s.mutable_batching()->set_method(proto::BatchingSpec::packing);
  ASSIGN_OR_RETURN(const PlanSet one, Plans(d, s));
  RETURN_IF_ERROR(Put(d, "plan", "pp1-packing.bin", one.SerializeAsString()));
  s = quickstart;
  for (int l : {0, 1, 0, 1}) s.mutable_parallelism()->add_layer_to_device(l);
  s.mutable_parallelism()->set_dp(1);
  s.mutable_schedule()->set_policy(proto::ScheduleSpec::interleaved_1f1b);
  ASSIGN_OR_RETURN(const PlanSet interleaved, Plans(d, s));
  RETURN_IF_ERROR(Put(d, "plan", "interleaved.bin", interleaved.SerializeAsString()));
  s = quickstart;
  s.mutable_model()->set_kind(proto::ModelKind::t5);
  s.mutable_model()->set_num_layers(2);
  s.mutable_model()->set_num_decoder_layers(2);
  s.mutable_parallelism()->set_dp(1);
  ASSIGN_OR_RETURN(const PlanSet t5, Plans(d, s));
  RETURN_IF_ERROR(Put(d, "plan", "t5-pp2.bin", t5.SerializeAsString()));

  PlanSet missing = pp2dp2;
  missing.mutable_plans()->RemoveLast();
  RETURN_IF_ERROR(Put(d, "plan", "bad-missing-rank.bin", missing.SerializeAsString()));
  PlanSet corrupt = pp2dp2;
  std::string& bytes = *corrupt.mutable_plans(0);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
  RETURN_IF_ERROR(Put(d, "plan", "bad-checksum.bin", corrupt.SerializeAsString()));
  PlanSet swapped = pp2;
  swapped.mutable_plans()->SwapElements(0, 1);
  RETURN_IF_ERROR(Put(d, "plan", "bad-rank-order.bin", swapped.SerializeAsString()));

  // Regressions: inputs that crashed ValidatePlans (planner/plan/validate_test.cc).
  struct Regression {
    const char* name;
    void (*edit)(proto::ExecutionPlan*);
  };
  const Regression regressions[] = {
      {"negative-slots", [](proto::ExecutionPlan* p) { p->set_num_buffer_slots(-1); }},
      {"huge-slots", [](proto::ExecutionPlan* p) { p->set_num_buffer_slots(2000000000); }},
      {"pp-dp-wrap", [](proto::ExecutionPlan* p) {  // 9 x 954437177 wraps to 1 in 32 bits
         p->set_pp_size(9);
         p->set_dp_size(954437177);
       }},
  };
  for (const Regression& r : regressions) {
    proto::ExecutionPlan p;
    if (!p.ParseFromString(one.plans(0))) return absl::InternalError("pp1-packing: plan does not parse");
    r.edit(&p);
    plan::SealPlan(&p);
    PlanSet set;
    set.add_plans(p.SerializeAsString());
    RETURN_IF_ERROR(Put(d, "plan", absl::StrCat("regress-", r.name, ".bin"), set.SerializeAsString()));
  }
  return absl::OkStatus();
}

// ---- http_head: status-endpoint request heads ---------------------------------
// The first byte is the size of each read the harness simulates.

absl::Status HttpHeadSeeds(const Dirs& d) {
  const std::string host = "\r\nHost: 127.0.0.1:9100";
  std::string many = "GET /metrics HTTP/1.1" + host;
  for (int i = 0; i < 70; ++i) absl::StrAppend(&many, "\r\nX-", i, ": v");
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"get-healthz", "GET /healthz HTTP/1.1" + host + "\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"},
      {"prometheus-scrape", "GET /metrics HTTP/1.1" + host +
                                "\r\nAccept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
                                "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"},
      {"head-keep-alive-pipelined", "HEAD /status?pretty=1 HTTP/1.1" + host + "\r\nConnection: keep-alive\r\n\r\n"
                                    "GET /healthz HTTP/1.0\r\n\r\n"},
      {"post-with-body", "POST /status HTTP/1.1" + host + "\r\nContent-Length: 5\r\n\r\nhello"},
      {"bad-no-colon", "GET /healthz HTTP/1.1" + host + "\r\nNoColonHere\r\n\r\n"},
      {"bad-bare-cr", "GET /healthz HTTP/1.1" + host + "\r\nX-A: a\rb\r\n\r\n"},
      {"bad-folded", "GET /healthz HTTP/1.1" + host + "\r\nX-A: a\r\n b\r\n\r\n"},
      {"bad-two-hosts", "GET /healthz HTTP/1.1" + host + host + "\r\n\r\n"},
      {"bad-cl-and-te", "POST / HTTP/1.1" + host + "\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"},
      {"bad-too-many-fields", many + "\r\n\r\n"},
      {"bad-version", "GET / HTTP/2.0" + host + "\r\n\r\n"},
  };
  for (size_t i = 0; i < seeds.size(); ++i) {
    const char piece = static_cast<char>(1 + (i * 7) % 64);
    RETURN_IF_ERROR(Put(d, "http_head", seeds[i].first + ".txt", std::string(1, piece) + seeds[i].second));
  }
  return absl::OkStatus();
}

absl::Status Run(const Dirs& d) {
  RETURN_IF_ERROR(Annotate(ConfigSeeds(d), "config"));
  RETURN_IF_ERROR(Annotate(LengthsSeeds(d), "lengths"));
  RETURN_IF_ERROR(Annotate(DatasetSeeds(d), "dataset"));
  RETURN_IF_ERROR(Annotate(CheckpointSeeds(d), "checkpoint"));
  RETURN_IF_ERROR(Annotate(SafetensorsSeeds(d), "safetensors"));
  RETURN_IF_ERROR(Annotate(PlanSeeds(d), "plan"));
  RETURN_IF_ERROR(Annotate(HttpHeadSeeds(d), "http_head"));
  return absl::OkStatus();
}

}  // namespace
}  // namespace dynapipe::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (relative to the repository root)\n");
    return 2;
  }
  // `bazel run` starts us in the runfiles tree; the repository is where it was run.
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  dynapipe::fuzz::Dirs d;
  d.root = workspace != nullptr ? workspace : fs::current_path().string();
  d.corpus = fs::path(argv[1]).is_absolute() ? argv[1] : d.root + "/" + argv[1];
  d.scratch = (fs::temp_directory_path() / ("dynapipe-seeds-" + std::to_string(::getpid()))).string();
  const absl::Status s = dynapipe::fuzz::Run(d);
  std::error_code ec;
  fs::remove_all(d.scratch, ec);
  if (!s.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("make_seeds: wrote %s\n", d.corpus.c_str());
  return 0;
}
