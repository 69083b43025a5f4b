#include "cli/export_command.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "cli/evaluate.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/hf_checkpoint.h"
#include "src/checkpoint/checkpoint.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::cli {
namespace {

constexpr char kUsage[] =
    "usage: dynapipe export JOB.pbtxt --out DIR [--checkpoint DIR] [--iteration K] [--max-shard-mb N]\n"
    "  the job's trained model in Hugging Face's format: DIR/model.safetensors (split into\n"
    "  model-0000i-of-0000n.safetensors with model.safetensors.index.json past --max-shard-mb, default 5000)\n"
    "  and DIR/config.json (GPT2LMHeadModel, T5ForConditionalGeneration or LlamaForCausalLM), from the\n"
    "  checkpoint shards (default: the job's checkpoint dir, latest complete iteration); the job need not run\n";

absl::Status Export(const std::string& job, const Args& a, std::ostream& out) {
  if (!a.Has("out")) return absl::InvalidArgumentError("export needs --out DIR");
  ASSIGN_OR_RETURN(int64_t iteration, a.Int("iteration", -1));
  if (a.Has("iteration") && iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--iteration: must be a checkpoint's iteration, got ", iteration));
  }
  ASSIGN_OR_RETURN(const int64_t max_mb, a.Int("max-shard-mb", kExportDefaultMaxShardMb));
  if (max_mb < 1) return absl::InvalidArgumentError(absl::StrCat("--max-shard-mb: must be positive, got ", max_mb));
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::LoadJobSpec(job));
  const proto::JobSpec& spec = normalized.proto();
  // The block must have a Hugging Face class before any shard is read.
  ASSIGN_OR_RETURN(const runtime::model::GptConfig config, runtime::model::GptConfig::FromSpec(spec.model()));
  ASSIGN_OR_RETURN(const std::string config_json, runtime::model::HfConfigJson(config));
  const std::string dir = a.Str("checkpoint", spec.checkpoint().dir());
  if (!a.Has("iteration")) {
    const int world = spec.parallelism().pp() * spec.parallelism().dp();
    ASSIGN_OR_RETURN(iteration, checkpoint::LatestCompleteOnDisk(dir, world));
    if (iteration < 0) return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", dir));
  }
  runtime::BufferPool pool(runtime::CpuAllocator());
  ASSIGN_OR_RETURN(auto model, LoadWholeModel(spec, dir, iteration, &pool));
  ASSIGN_OR_RETURN(const std::vector<runtime::model::HfTensor> tensors,
                   runtime::model::ToHuggingFace(model->layout(), model->param_data()));
  const std::string out_dir = a.Str("out");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--out ", out_dir, ": ", ec.message()));
  RETURN_IF_ERROR(runtime::model::WriteHfModel(tensors, config_json, out_dir, static_cast<uint64_t>(max_mb) << 20, &out));
  out << absl::StrFormat("exported iteration %d of %s: %d tensors, %.1f MB (%s) to %s\n", iteration, spec.name(),
                         tensors.size(), model->layout().num_params() * 4.0 / 1e6,
                         runtime::model::HfArchitecture(config), out_dir);
  return absl::OkStatus();
}

}  // namespace

int RunExportCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.empty() || argv[0] == "--help") {
    (argv.empty() ? err : out) << kUsage;
    return argv.empty() ? 2 : 0;
  }
  auto fail = [&](const absl::Status& s) {
    err << "dynapipe export: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  if (argv[0].rfind("--", 0) == 0) return fail(absl::InvalidArgumentError("the job file comes first (dynapipe export JOB.pbtxt --out DIR)"));
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  auto args = Args::Parse(rest, {"out", "checkpoint", "iteration", "max-shard-mb"}, {});
  if (!args.ok()) return fail(args.status());
  const absl::Status s = Export(argv[0], *args, out);
  return s.ok() ? 0 : fail(s);
}

}  // namespace dynapipe::cli
