#include "src/cli/profile_command.h"

#include <algorithm>
#include <chrono>
#include <ostream>

#include "absl/strings/str_format.h"
#include "proto/job.pb.h"
#include "runtime/model/gpt.h"
#include "runtime/model/profile.h"
#include "src/cli/args.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::cli {
namespace {

constexpr char kUsage[] =
    "usage: dynapipe profile --job JOB.pbtxt --out PROFILE.json [--device cpu|cuda] [--max_tokens N]\n"
    "                        [--repetitions N] [--seq L1,L2,..] [--mbs M1,M2,..]\n"
    "  times one layer, the embedding and the head of the job's model with the executor's kernels\n"
    "  (--device cpu: this machine's CPU backend; cuda: the GPU, with dynapipe-gpu-profile)\n"
    "  (forward + backward, median of N runs, default 3) over micro-batch shapes, and writes the\n"
    "  cost profile; set the job's cost_profile_path to plan with it. Defaults: seq from the job's\n"
    "  round_multiple to max_seq_len about 1.5x apart; mbs 1, 2, 4, ...; shapes up to max_tokens\n"
    "  (default twice the job's global_batch_tokens).\n";

absl::Status Profile(const Args& a, std::ostream& out, std::ostream& err, const ProfileBackends& backends) {
  if (!a.Has("job") || !a.Has("out")) return absl::InvalidArgumentError("profile needs --job and --out");
  const std::string device = a.Has("device") ? a.Str("device") : backends.default_device;
  const auto profiler = backends.by_device.find(device);
  if (profiler == backends.by_device.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device: '", device, "' is not available in this program",
        device == "cuda" ? " (use dynapipe-gpu-profile from a CUDA build or bundle)" : " (cpu or cuda)"));
  }
  ASSIGN_OR_RETURN(const proto::JobSpec spec, spec::LoadJobSpec(a.Str("job")));
  ASSIGN_OR_RETURN(const runtime::model::GptConfig config, runtime::model::GptConfig::FromSpec(spec.model()));
  const proto::BatchingSpec& b = spec.batching();
  const int step = b.round_multiple();
  const int max_seq = b.max_seq_len();
  const int64_t batch_tokens = b.global_batch_tokens();

  runtime::model::ProfileOptions o;
  ASSIGN_OR_RETURN(o.max_tokens, a.Int("max_tokens", 2 * batch_tokens));
  if (o.max_tokens < max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tokens: ", o.max_tokens, " is below one row of max_seq_len (", max_seq, ")"));
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
  ASSIGN_OR_RETURN(const proto::CostProfile profile, profiler->second(config, o));
  RETURN_IF_ERROR(Annotate(WriteFileAtomic(a.Str("out"), ToJson(profile, /*pretty=*/true) + "\n"), "--out"));
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
  auto args = Args::Parse(argv, {"job", "out", "device", "max_tokens", "repetitions", "seq", "mbs"}, {});
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
