#include "cli/eval_command.h"

#include <ostream>

#include "absl/strings/str_format.h"
#include "src/checkpoint/checkpoint.h"
#include "cli/evaluate.h"
#include "cli/args.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::cli {
namespace {

constexpr char kUsage[] =
    "usage: dynapipe eval --job JOB.pbtxt --data DIR [--checkpoint DIR] [--iteration K] [--samples N]\n"
    "  per-task token accuracy and exact match (teacher forcing) of the checkpoint (default: the job's\n"
    "  checkpoint dir, latest complete iteration) on the dataset in DIR, beside the initial model\n";

absl::Status Eval(const Args& a, std::ostream& out) {
  if (!a.Has("job") || !a.Has("data")) return absl::InvalidArgumentError("eval needs --job and --data");
  // Flags first: a bad value is named before any file is read. (A negative
  // iteration would evaluate the initial model as if it were a checkpoint.)
  ASSIGN_OR_RETURN(const int64_t samples, a.Int("samples", 500));
  if (samples < 1) return absl::InvalidArgumentError(absl::StrCat("--samples: must be positive, got ", samples));
  ASSIGN_OR_RETURN(int64_t iteration, a.Int("iteration", -1));
  if (a.Has("iteration") && iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--iteration: must be a checkpoint's iteration (0 or more), got ",
                                                   iteration));
  }
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::LoadJobSpec(a.Str("job")));
  const proto::JobSpec& spec = normalized.proto();
  const std::string dir = a.Str("checkpoint", spec.checkpoint().dir());
  const int world = spec.parallelism().pp() * spec.parallelism().dp();
  if (!a.Has("iteration")) {
    ASSIGN_OR_RETURN(iteration, checkpoint::LatestCompleteOnDisk(dir, world));
    if (iteration < 0) return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", dir));
  }
  ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(a.Str("data")));
  const int max_seq = spec.batching().max_seq_len();
  runtime::BufferPool pool(runtime::CpuAllocator());
  ASSIGN_OR_RETURN(auto initial, cli::LoadWholeModel(spec, dir, -1, &pool));
  ASSIGN_OR_RETURN(auto trained, cli::LoadWholeModel(spec, dir, iteration, &pool));
  ASSIGN_OR_RETURN(const auto before, cli::Evaluate(*initial, *dataset, samples, max_seq));
  ASSIGN_OR_RETURN(const auto after, cli::Evaluate(*trained, *dataset, samples, max_seq));
  out << absl::StrFormat("held-out accuracy, %s, checkpoint of iteration %d (teacher forcing)\n", a.Str("data"),
                         iteration);
  out << absl::StrFormat("%-16s %8s %22s %22s\n", "task", "samples", "token acc init->now", "exact init->now");
  for (size_t t = 0; t < after.size(); ++t) {
    const auto& b = before[t];
    const auto& f = after[t];
    if (f.samples == 0) continue;
    auto pct = [](int64_t num, int64_t den) { return den > 0 ? 100.0 * num / den : 0.0; };
    out << absl::StrFormat("%-16s %8d %9.1f%% -> %6.1f%% %9.1f%% -> %6.1f%%\n", f.task, f.samples,
                           pct(b.correct, b.tokens), pct(f.correct, f.tokens), pct(b.exact, b.samples),
                           pct(f.exact, f.samples));
  }
  return absl::OkStatus();
}

}  // namespace

int RunEvalCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (!argv.empty() && argv[0] == "--help") {
    out << kUsage;
    return 0;
  }
  auto args = Args::Parse(argv, {"job", "data", "checkpoint", "iteration", "samples"}, {});
  if (!args.ok()) {
    err << "dynapipe eval: " << args.status().message() << "\n" << kUsage;
    return 2;
  }
  const absl::Status s = Eval(*args, out);
  if (s.ok()) return 0;
  err << "dynapipe eval: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace dynapipe::cli
