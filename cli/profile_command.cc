#include "cli/profile_command.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <ostream>

#include "absl/strings/str_format.h"
#include "proto/job.pb.h"
#include "runtime/model/gpt.h"
#include "planner/cost_model/refit_cost_model.h"
#include "cli/local_run.h"
#include "runtime/model/profile.h"
#include "cli/args.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::cli {
namespace {

constexpr char kUsage[] =
    "usage: dynapipe profile --job JOB.pbtxt --out PROFILE.json [--device cpu|cuda] [--max-tokens N]\n"
    "                        [--repetitions N] [--seq L1,L2,..] [--mbs M1,M2,..]\n"
    "                        [--iterations N] [--data-root DIR]\n"
    "  times one layer, the embedding and the head of the job's model with the executor's kernels\n"
    "  (--device cpu: this machine's CPU backend; cuda: the GPU, with dynapipe-gpu-profile)\n"
    "  (forward + backward, median of N runs, default 3) over micro-batch shapes, and writes the\n"
    "  cost profile; set the job's cost_profile_path to plan with it. Defaults: seq from the job's\n"
    "  round_multiple to max_seq_len about 1.5x apart; mbs 1, 2, 4, ...; shapes up to max_tokens\n"
    "  (default twice the job's global_batch_tokens).\n"
    "  Then (cpu) trains the job itself for --iterations (default 40; 0: skip) under its own pp x dp\n"
    "  on this machine, its dataset under --data-root (default .), and refits the profile to what\n"
    "  it measured: the per-micro-batch dispatch and hand-off, transfers, the work after the\n"
    "  pipeline and ranks sharing cores, which single-layer timings leave out. --out must then lie\n"
    "  under --data-root.\n";

// Iterations trained to measure the terms layers leave out. The quickstart's
// job planned from profiles measured over 12 iterations predicted 15.5-21.3
// ms per iteration against 23.1-24.1 measured (the fit follows a few noisy
// iterations on a shared CPU); over 40, 23.1-24.7 against 23.2-23.5
// (2026-11-28: two profiles at 12, three at 40).
constexpr int64_t kDefaultMeasureIterations = 40;

// Trains `spec` planned with the profile at `out` for `iterations` and
// returns the terms the cost refit measured.
absl::StatusOr<proto::MeasuredTerms> MeasureTerms(proto::JobSpec spec, const std::string& data_root,
                                                  const std::string& out, int iterations) {
  std::error_code ec;
  const std::filesystem::path rel =
      std::filesystem::relative(std::filesystem::absolute(out), std::filesystem::absolute(data_root), ec);
  if (ec || rel.empty() || *rel.begin() == "..") {
    return absl::InvalidArgumentError(absl::StrCat("--out: ", out, " is not under --data-root ", data_root,
                                                   " (needed to train with it; --iterations 0 skips that)"));
  }
  spec.set_cost_profile_path(rel.string());
  spec.set_iterations(std::max<int64_t>(spec.iterations(), iterations));
  spec.mutable_checkpoint()->Clear();
  proto::CostRefitSpec* refit = spec.mutable_cost_refit();
  refit->set_mode(proto::CostRefitSpec::on);
  refit->set_window(iterations);
  refit->set_min_iterations(std::min(spec::kDefaultRefitMinIterations, iterations));
  ASSIGN_OR_RETURN(const cli::LocalRunResult run, cli::RunLocal(spec, data_root, iterations));
  if (!run.models[0].refit_fitted) return absl::FailedPreconditionError("the refit saw too few iterations");
  proto::MeasuredTerms terms = planner::ToProto(run.models[0].refit_terms);
  terms.set_pp(spec.parallelism().pp());
  terms.set_dp(spec.parallelism().dp());
  terms.set_iterations(iterations);
  return terms;
}

absl::Status Profile(const Args& a, std::ostream& out, std::ostream& err, const ProfileBackends& backends) {
  if (!a.Has("job") || !a.Has("out")) return absl::InvalidArgumentError("profile needs --job and --out");
  const std::string device = a.Has("device") ? a.Str("device") : backends.default_device;
  const auto profiler = backends.by_device.find(device);
  if (profiler == backends.by_device.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device: '", device, "' is not available in this program",
        device == "cuda" ? " (use dynapipe-gpu-profile from a CUDA build or bundle)" : " (cpu or cuda)"));
  }
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::LoadJobSpec(a.Str("job")));
  const proto::JobSpec& spec = normalized.proto();
  ASSIGN_OR_RETURN(const runtime::model::GptConfig config, runtime::model::GptConfig::FromSpec(spec.model()));
  const proto::BatchingSpec& b = spec.batching();
  const int step = b.round_multiple();
  const int max_seq = b.max_seq_len();
  const int64_t batch_tokens = b.global_batch_tokens();

  runtime::model::ProfileOptions o;
  ASSIGN_OR_RETURN(o.max_tokens, a.Int("max-tokens", 2 * batch_tokens));
  if (o.max_tokens < max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens: ", o.max_tokens, " is below one row of max_seq_len (", max_seq, ")"));
  }
  ASSIGN_OR_RETURN(const int64_t reps, a.Int("repetitions", 3));
  o.repetitions = static_cast<int>(reps);
  if (a.Has("seq")) {
    ASSIGN_OR_RETURN(o.seq, a.IntList("seq"));
  } else {
    o.seq = runtime::model::ProfileSeqAxis(step, max_seq);
  }
  if (a.Has("mbs")) {
    ASSIGN_OR_RETURN(o.mbs, a.IntList("mbs"));
  } else {
    o.mbs = runtime::model::ProfileMbsAxis(o.seq.empty() ? step : o.seq.front(), o.max_tokens);
  }
  o.seed = spec.seed() != 0 ? spec.seed() : 1;
  const auto start = std::chrono::steady_clock::now();
  int last_quarter = -1;
  o.progress = [&](const std::string& kind, int done, int total) {
    const int quarter = 4 * done / total;
    if (done != total && quarter == last_quarter) return;
    last_quarter = done == total ? -1 : quarter;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    err << absl::StrFormat("profile: %-11s %4d/%d shapes  (%.0f s)\n", kind, done, total, s);
  };
  ASSIGN_OR_RETURN(proto::CostProfile profile, profiler->second(config, o));
  profile.set_model_kind(spec.model().kind());
  profile.set_kv_heads(config.KvHeads());
  RETURN_IF_ERROR(Annotate(WriteFileAtomic(a.Str("out"), ToJson(profile, /*pretty=*/true) + "\n"), "--out"));
  ASSIGN_OR_RETURN(const int64_t iterations, a.Int("iterations", kDefaultMeasureIterations));
  if (iterations > 0 && device == "cpu") {
    err << absl::StrFormat("profile: training %d iterations under pp %d x dp %d to measure what layers leave out\n",
                           iterations, spec.parallelism().pp(), spec.parallelism().dp());
    ASSIGN_OR_RETURN(*profile.mutable_measured(), MeasureTerms(spec, a.Has("data-root") ? a.Str("data-root") : ".",
                                                               a.Str("out"), static_cast<int>(iterations)));
    RETURN_IF_ERROR(Annotate(WriteFileAtomic(a.Str("out"), ToJson(profile, /*pretty=*/true) + "\n"), "--out"));
    const proto::MeasuredTerms& t = profile.measured();
    out << absl::StrFormat(
        "measured under pp %d x dp %d: %.2f / %.2f ms per micro-batch and chunk (forward / backward), compute x%.2f / "
        "x%.2f, transfers %.3f ms + %.3f ms/MB, %.1f ms per iteration after the pipeline\n",
        t.pp(), t.dp(), t.fw().micro_batch_ms() + t.dispatch_fw_ms(), t.bw().micro_batch_ms() + t.dispatch_bw_ms(),
        t.fw().scale(), t.bw().scale(), t.transfer_latency_ms(), t.transfer_ms_per_mb(), t.iteration_ms());
  }
  out << absl::StrFormat("wrote %s (%s): %d layer kinds, seq %d..%d, mbs %d..%d, up to %d tokens\n", a.Str("out"),
                         profile.device(), profile.layers_size(), o.seq.front(), o.seq.back(), o.mbs.front(), o.mbs.back(),
                         o.max_tokens);
  return absl::OkStatus();
}

}  // namespace

ProfileBackends CpuProfileBackends() {
  ProfileBackends b;
  b.by_device["cpu"] = &runtime::model::ProfileGpt;
  return b;
}

int RunProfileCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err,
                      const ProfileBackends& backends) {
  if (!argv.empty() && argv[0] == "--help") {
    out << kUsage;
    return 0;
  }
  auto args = Args::Parse(
      argv, {"job", "out", "device", "max-tokens", "repetitions", "seq", "mbs", "iterations", "data-root"}, {});
  if (!args.ok()) {
    err << "dynapipe profile: " << args.status().message() << "\n" << kUsage;
    return 2;
  }
  const absl::Status s = Profile(*args, out, err, backends);
  if (s.ok()) return 0;
  err << "dynapipe profile: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace dynapipe::cli
