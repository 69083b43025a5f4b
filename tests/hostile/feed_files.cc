#include "tests/hostile/feed_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/text_format.h"
#include "tests/hostile/job_corpus.h"

namespace dynapipe::testing::hostile {
namespace {

namespace fs = std::filesystem;

constexpr char kSpecGrpc[] = "Job spec fields → planner `Submit` over gRPC (no CLI checks)";
constexpr char kSpecCli[] = "Job spec fields → `dynapipe submit JOB.pbtxt`";
constexpr char kPathGrpc[] = "Job paths (dataset, checkpoint dir, cost profile) → `Submit` over gRPC";
constexpr char kPathPermissive[] = "Job paths → `Submit` on a planner with `--data_root=/`";
constexpr char kPathCli[] = "Job paths → `dynapipe submit`";
constexpr char kSpecFiles[] = "Job spec files (broken text proto / JSON, binary junk) → `dynapipe submit`";
constexpr char kLengthsGrpc[] = "Lengths files → `Submit` (dataset.format lengths)";
constexpr char kLengthsCli[] = "Lengths files → `dynapipe data synth --lengths`";
constexpr char kDatasetGrpc[] = "Indexed datasets → `Submit` (dataset.format indexed)";
constexpr char kDatasetCli[] = "Indexed datasets → `dynapipe data info`";
constexpr char kShards[] = "Checkpoint shards → `dynapipe eval --checkpoint`";
constexpr char kWeights[] = "Hugging Face weights (model.init_from) → `Submit` (headers; tensors when the stages load)";
constexpr char kFlags[] = "CLI flags and arguments";

std::string TextProto(const proto::JobSpec& spec) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  return text;
}

// Writes `spec` as a text proto for the CLI; the file's path.
std::string SpecFile(const proto::JobSpec& spec, const std::string& dir) {
  static int n = 0;
  const std::string path = absl::StrCat(dir, "/spec-", n++, ".pbtxt");
  std::ofstream(path, std::ios::binary) << TextProto(spec);
  return path;
}

// `dynapipe submit FILE`; an accepted job (its id on stdout) is cancelled.
Result CliSubmit(PlannerUnderTest& p, const std::string& file) {
  const ProcessResult run = p.Cli("submit", {file});
  if (run.exit_code == 0) p.Cancel(std::string(absl::StripAsciiWhitespace(run.out)));
  return p.Classify(run);
}

ProcessResult RunCli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CliPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, kDeadline + absl::Seconds(10), {{"OPENBLAS_NUM_THREADS", "1"}});
}

using CliRun = std::pair<std::string, std::function<ProcessResult()>>;  // input name, the run

// Runs `runs` four at a time (a CLI run is mostly process start-up and
// waiting on the planner), then classifies them in order. A CLI crash or hang
// is its own; a planner that died meanwhile is blamed on the first run
// classified after it (the planner is checked after each).
void AddAll(PlannerUnderTest& p, Tally& t, const char* surface, const std::vector<CliRun>& runs) {
  std::vector<ProcessResult> results(runs.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      for (size_t i; (i = next++) < runs.size();) results[i] = runs[i].second();
    });
  }
  for (std::thread& w : workers) w.join();
  for (size_t i = 0; i < runs.size(); ++i) t.Add(surface, runs[i].first, p.Classify(results[i]));
}

// `dynapipe submit FILE` for each (name, file); accepted jobs are cancelled.
void AddSubmits(PlannerUnderTest& p, Tally& t, const char* surface,
                const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<CliRun> runs;
  for (const auto& [name, file] : files) {
    runs.push_back({name, [&p, file] {
                      ProcessResult r = p.Cli("submit", {file});
                      if (r.exit_code == 0) p.Cancel(std::string(absl::StripAsciiWhitespace(r.out)));
                      return r;
                    }});
  }
  AddAll(p, t, surface, runs);
}

proto::JobSpec WithPath(proto::JobSpec spec, unsigned field, const std::string& path) {
  // Global batches within the smallest legal dataset named below (the
  // indexed one: 1,460 tokens; lengths-edge.txt: 1,032), so a refusal is
  // about the path.
  if (field == kLengthsPath || field == kIndexedPath) spec.mutable_batching()->set_global_batch_tokens(512);
  switch (field) {
    case kLengthsPath:
      spec.mutable_dataset()->set_path(path);
      spec.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
      break;
    case kIndexedPath:
      spec.mutable_dataset()->set_path(path);
      spec.mutable_dataset()->set_format(proto::DatasetSpec::indexed);
      break;
    case kCheckpointDir:
      spec.mutable_checkpoint()->set_dir(path);
      spec.mutable_checkpoint()->set_interval(2);
      break;
    case kCostProfilePath:
      spec.set_cost_profile_path(path);
      break;
  }
  return spec;
}

const char* FieldName(unsigned field) {
  switch (field) {
    case kLengthsPath:
      return "dataset.path (lengths)";
    case kIndexedPath:
      return "dataset.path (indexed)";
    case kCheckpointDir:
      return "checkpoint.dir";
    default:
      return "cost_profile_path";
  }
}

// Each (path, field) a case is garbage for.
std::vector<std::pair<std::string, proto::JobSpec>> PathJobs(const proto::JobSpec& base,
                                                            const std::vector<PathCase>& cases) {
  std::vector<std::pair<std::string, proto::JobSpec>> out;
  for (const PathCase& c : cases) {
    for (unsigned f : {kLengthsPath, kIndexedPath, kCheckpointDir, kCostProfilePath}) {
      if (c.fields & f) out.push_back({absl::StrCat(FieldName(f), ": ", c.name), WithPath(base, f, c.path)});
    }
  }
  return out;
}

}  // namespace

std::string CorpusDir() { return RunfilesRoot() + "/tests/hostile/corpus"; }

// ---- Job specs ----

void FeedJobSpecs(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const std::string& files) {
  for (const SpecCase& c : ValidControls(base)) {
    const Result grpc = p.Submit(c.spec);
    t.AddControl(kSpecGrpc, c.name, grpc.outcome == Outcome::kAccepted, grpc.code + ": " + grpc.message);
    const Result cli = CliSubmit(p, SpecFile(c.spec, files));
    t.AddControl(kSpecCli, c.name, cli.outcome == Outcome::kAccepted, cli.code + ": " + cli.message);
  }
  std::vector<SpecCase> cases = NumericMutations(base);
  for (auto* more : {&FieldMutations, &StringMutations}) {
    for (SpecCase& c : (*more)(base)) cases.push_back(std::move(c));
  }
  for (const SpecCase& c : cases) t.Add(kSpecGrpc, c.name, p.Submit(c.spec));
  std::vector<std::pair<std::string, std::string>> cli;
  for (const SpecCase& c : cases) cli.push_back({c.name, SpecFile(c.spec, files)});
  AddSubmits(p, t, kSpecCli, cli);
}

void FeedJobPaths(PlannerUnderTest& p, PlannerUnderTest& permissive, Tally& t, const proto::JobSpec& base,
                  const DataRoot& root, const std::string& fifo, const std::string& files) {
  // Legal paths, so that a refusal below is about the path.
  const std::vector<std::pair<std::string, proto::JobSpec>> controls = {
      {"dataset.path (indexed): a valid dataset", WithPath(base, kIndexedPath, root.dataset)},
      {"dataset.path (lengths): absolute, inside the root", WithPath(base, kLengthsPath, root.root + "/lengths.txt")},
      {"checkpoint.dir: a new directory", WithPath(base, kCheckpointDir, "ckpt-new/run")},
  };
  for (const auto& [name, spec] : controls) {
    const Result r = p.Submit(spec);
    t.AddControl(kPathGrpc, name, r.outcome == Outcome::kAccepted, r.code + ": " + r.message);
  }
  // Checkpoint directories whose contents make the job illegal.
  std::error_code ec;
  for (const std::string f : {"ckpt-full/iter-00000003/rank-00000.ckpt", "ckpt-full/iter-00000003/rank-00001.ckpt",
                              "ckpt-partial/iter-00000001/rank-00000.ckpt"}) {
    fs::create_directories(fs::path(root.root + "/" + f).parent_path(), ec);
    std::ofstream(root.root + "/" + f) << "x";
  }
  auto jobs = PathJobs(base, root.bad_paths);
  jobs.push_back({"checkpoint.dir holding shards, without resume", WithPath(base, kCheckpointDir, "ckpt-full")});
  proto::JobSpec resume = WithPath(base, kCheckpointDir, "ckpt-partial");
  resume.mutable_checkpoint()->set_resume(true);
  jobs.push_back({"checkpoint.resume from shards no checkpoint completes", resume});
  resume.mutable_checkpoint()->set_dir("ckpt-full");
  jobs.push_back({"checkpoint.resume from a checkpoint past the job's iterations", resume});
  for (const auto& [name, spec] : jobs) t.Add(kPathGrpc, name, p.Submit(spec));
  for (const auto& [name, spec] : PathJobs(base, PermissiveRootPaths(fifo))) {
    t.Add(kPathPermissive, name, permissive.Submit(spec));
  }
  std::vector<std::pair<std::string, std::string>> cli;
  for (const auto& [name, spec] : jobs) cli.push_back({name, SpecFile(spec, files)});
  AddSubmits(p, t, kPathCli, cli);
}

void FeedSpecFiles(PlannerUnderTest& p, Tally& t, const std::string& scratch) {
  for (const char* valid : {"job.pbtxt", "job.json"}) {
    const Result r = CliSubmit(p, CorpusDir() + "/valid/" + valid);
    t.AddControl(kSpecFiles, absl::StrCat("corpus/valid/", valid), r.outcome == Outcome::kAccepted,
                 r.code + ": " + r.message);
  }
  std::vector<std::pair<std::string, std::string>> files;  // name, path
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(CorpusDir() + "/specs", ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) files.push_back({"corpus/specs/" + n, CorpusDir() + "/specs/" + n});
  const std::string dir = scratch + "/spec-files";
  fs::create_directories(dir, ec);
  auto write = [&](const std::string& name, const std::string& file, const std::string& bytes) {
    std::ofstream(dir + "/" + file, std::ios::binary) << bytes;
    files.push_back({name, dir + "/" + file});
  };
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    write(absl::StrCat(200 + 40 * seed, " random bytes as .pbtxt (seed ", seed, ")"), absl::StrCat("junk-", seed, ".pbtxt"),
          RandomBytes(200 + 40 * seed, 100 + seed));
  }
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    write(absl::StrCat("300 random bytes as .json (seed ", seed, ")"), absl::StrCat("junk-", seed, ".json"),
          RandomBytes(300, 200 + seed));
  }
  std::string nested;
  for (int i = 0; i < 5000; ++i) nested += "model { ";
  write("messages nested 5000 deep", "nested.pbtxt", nested);
  write("JSON arrays nested 100,000 deep", "nested.json", std::string(100000, '[') + std::string(100000, ']'));
  write("text proto with a NUL in a string", "nul.pbtxt", std::string("name: \"a\0b\"\n", 12));
  write("a 1 MB name", "long-name.pbtxt", "name: \"" + std::string(1 << 20, 'n') + "\"\n");
  files.push_back({"/dev/zero", "/dev/zero"});
  ::mkfifo((dir + "/fifo.pbtxt").c_str(), 0600);
  files.push_back({"a FIFO named .pbtxt", dir + "/fifo.pbtxt"});
  fs::create_directories(dir + "/adir.pbtxt", ec);
  files.push_back({"a directory named .pbtxt", dir + "/adir.pbtxt"});
  files.push_back({"nonexistent .pbtxt", dir + "/does-not-exist.pbtxt"});
  std::ofstream(dir + "/sparse.pbtxt") << "# ";
  fs::resize_file(dir + "/sparse.pbtxt", (uintmax_t{1} << 30) + 1, ec);
  files.push_back({"sparse .pbtxt of 1 GiB + 1 byte", dir + "/sparse.pbtxt"});
  AddSubmits(p, t, kSpecFiles, files);
}

// ---- Data ----

void FeedLengthsFiles(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const DataRoot& root,
                      const std::string& scratch) {
  for (const FileCase& c : root.good_lengths) {
    const Result r = p.Submit(WithPath(base, kLengthsPath, c.path));
    t.AddControl(kLengthsGrpc, c.name, r.outcome == Outcome::kAccepted, r.code + ": " + r.message);
  }
  const Result synth = p.Classify(RunCli({"data", "synth", "--lengths", root.root + "/lengths.txt", "--out",
                                          scratch + "/synth-control", "--samples", "5"}));
  t.AddControl(kLengthsCli, "lengths.txt (400 samples)", synth.outcome == Outcome::kAccepted,
               synth.code + ": " + synth.message);
  std::vector<CliRun> runs;
  for (const FileCase& c : root.bad_lengths) {
    t.Add(kLengthsGrpc, c.name, p.Submit(WithPath(base, kLengthsPath, c.path)));
    const std::vector<std::string> args = {"data", "synth", "--lengths", root.root + "/" + c.path, "--out",
                                           absl::StrCat(scratch, "/synth-", runs.size()), "--samples", "5"};
    runs.push_back({c.name, [args] { return RunCli(args); }});
  }
  AddAll(p, t, kLengthsCli, runs);
}

void FeedDatasets(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const DataRoot& root) {
  const Result control = p.Classify(RunCli({"data", "info", root.root + "/" + root.dataset}));
  t.AddControl(kDatasetCli, "a dataset written by DatasetWriter", control.outcome == Outcome::kAccepted,
               control.code + ": " + control.message);
  std::vector<CliRun> runs;
  for (const FileCase& c : root.bad_datasets) {
    t.Add(kDatasetGrpc, c.name, p.Submit(WithPath(base, kIndexedPath, c.path)));
    const std::string dir = root.root + "/" + c.path;
    runs.push_back({c.name, [dir] { return RunCli({"data", "info", dir}); }});
  }
  for (const FileCase& c : root.bad_datasets_cli_only) {
    const std::string dir = root.root + "/" + c.path;
    runs.push_back({c.name, [dir] { return RunCli({"data", "info", dir}); }});
  }
  AddAll(p, t, kDatasetCli, runs);
  for (const FileCase& c : root.bad_datasets_planner_only) {
    t.Add(kDatasetGrpc, c.name, p.Submit(WithPath(base, kIndexedPath, c.path)));
  }
}

void FeedWeights(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const WeightsCorpus& c) {
  auto with = [&base](const std::string& path) {
    proto::JobSpec s = base;
    s.mutable_model()->set_init_from(path);
    return s;
  };
  const Result control = p.Submit(with(c.valid));
  t.AddControl(kWeights, "a folder written by safetensors::Write, with config.json",
               control.outcome == Outcome::kAccepted, control.code + ": " + control.message);
  for (const FileCase& f : c.bad) t.Add(kWeights, f.name, p.Submit(with(f.path)));
}

void FeedCheckpoints(PlannerUnderTest& p, Tally& t, const CheckpointCorpus& c) {
  auto eval = [&c](const std::string& dir, const std::string& data) {
    const std::vector<std::string> args = {"eval", "--job", c.job, "--data", data, "--checkpoint", dir,
                                           "--iteration", absl::StrCat(kEvalIteration), "--samples", "8"};
    return [args] { return RunCli(args); };
  };
  const Result control = p.Classify(eval(c.valid_dir, c.data)());
  t.AddControl(kShards, "a shard written by WriteShard", control.outcome == Outcome::kAccepted,
               control.code + ": " + control.message);
  std::vector<CliRun> runs;
  for (const ShardCase& s : c.bad) runs.push_back({s.name, eval(s.dir, c.data)});
  runs.push_back({"--data whose token ids exceed the model's vocabulary", eval(c.valid_dir, c.bad_vocab_data)});
  AddAll(p, t, kShards, runs);
}

// ---- CLI flags ----

void FeedCliFlags(PlannerUnderTest& p, Tally& t, const std::string& scratch, const std::string& fifo,
                  const CheckpointCorpus& ckpt) {
  const std::string dir = scratch + "/flags";
  std::error_code ec;
  fs::create_directories(dir + "/adir", ec);
  const std::string job = CorpusDir() + "/valid/job.pbtxt";
  auto secret = [&](const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), mode);
    return path;
  };
  const std::string readable = secret("token-0644", p.token() + "\n", 0644);
  const std::string huge = secret("token-2mb", std::string(2 << 20, 't'), 0600);
  const std::string wrong = secret("token-wrong", "not-the-token\n", 0600);
  const std::string addr = p.address();
  auto submit_with = [&](std::vector<std::string> flags) {
    std::vector<std::string> args = {"submit"};
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"submit without a file", submit_with({"--planner", addr})},
      {"submit with two files", submit_with({"--planner", addr, job, job})},
      {"--token-file /dev/zero", submit_with({"--planner", addr, "--token-file", "/dev/zero", job})},
      {"--token-file a FIFO", submit_with({"--planner", addr, "--token-file", fifo, job})},
      {"--token-file a directory", submit_with({"--planner", addr, "--token-file", dir + "/adir", job})},
      {"--token-file nonexistent", submit_with({"--planner", addr, "--token-file", dir + "/nope", job})},
      {"--token-file others can read (0644)", submit_with({"--planner", addr, "--token-file", readable, job})},
      {"--token-file of 2 MB", submit_with({"--planner", addr, "--token-file", huge, job})},
      {"--token-file with the wrong token", submit_with({"--planner", addr, "--token-file", wrong, job})},
      {"--timeout-s abc", submit_with({"--planner", addr, "--timeout-s", "abc", job})},
      {"--timeout-s 2^64", submit_with({"--planner", addr, "--timeout-s", "18446744073709551616", job})},
      {"--planner empty", submit_with({"--planner", "", "--timeout-s", "2", job})},
      {"--planner not an address", submit_with({"--planner", "not an address", "--timeout-s", "2", job})},
      {"--planner port 99999", submit_with({"--planner", "127.0.0.1:99999", "--timeout-s", "2", job})},
      {"an unknown flag", submit_with({"--planner", addr, "--frobnicate", "x", job})},
      {"--json=1 (a switch given a value)", {"list", "--planner", addr, "--json=1"}},
      {"an unknown command", {"frobnicate"}},
      {"status with a 100 KB job id", {"status", "--planner", addr, "--timeout-s", "5", std::string(100 << 10, 'j')}},
      {"status with three job ids", {"status", "--planner", addr, "a", "b", "c"}},
      {"cancel an empty job id", {"cancel", "--planner", addr, ""}},
      {"cancel a job that does not exist", {"cancel", "--planner", addr, "no-such-job"}},
      {"watch a job that does not exist", {"watch", "--planner", addr, "--timeout-s", "5", "no-such-job"}},
      {"eval --iteration -1", {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--iteration", "-1"}},
      {"eval --iteration -5", {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--iteration", "-5"}},
      {"eval --iteration abc", {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--iteration", "abc"}},
      {"eval --iteration 2^64",
       {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--iteration", "18446744073709551616"}},
      {"eval --samples -1", {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--iteration", "5", "--samples", "-1"}},
      {"eval --samples 0", {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--iteration", "5", "--samples", "0"}},
      {"eval --samples abc", {"eval", "--job", ckpt.job, "--data", ckpt.data, "--checkpoint", ckpt.valid_dir, "--samples", "abc"}},
      {"eval without --data", {"eval", "--job", ckpt.job}},
      {"eval --job an unparsable JSON file", {"eval", "--job", CorpusDir() + "/specs/bad.json", "--data", ckpt.data}},
      {"eval --job /dev/zero", {"eval", "--job", "/dev/zero", "--data", ckpt.data}},
      {"eval --data a FIFO", {"eval", "--job", ckpt.job, "--data", fifo, "--checkpoint", ckpt.valid_dir, "--iteration", "5"}},
      {"data info without a directory", {"data", "info"}},
      {"data info with two directories", {"data", "info", ckpt.data, ckpt.data}},
      {"data info /dev/zero", {"data", "info", "/dev/zero"}},
      {"data synth --samples -5", {"data", "synth", "--lengths", CorpusDir() + "/lengths/words.txt", "--out", dir + "/s1", "--samples", "-5"}},
      {"data synth --alphabet 1", {"data", "synth", "--lengths", CorpusDir() + "/lengths/words.txt", "--out", dir + "/s2", "--alphabet", "1"}},
      {"data synth --input-scale nan", {"data", "synth", "--lengths", CorpusDir() + "/lengths/words.txt", "--out", dir + "/s3", "--input-scale", "nan"}},
  };
  std::vector<CliRun> cli;
  for (const auto& [name, args] : runs) {
    cli.push_back({name, [&p, args] {
                     ProcessResult r = RunCli(args);
                     if (r.exit_code == 0 && args[0] == "submit") p.Cancel(std::string(absl::StripAsciiWhitespace(r.out)));
                     return r;
                   }});
  }
  AddAll(p, t, kFlags, cli);
}

}  // namespace dynapipe::testing::hostile
