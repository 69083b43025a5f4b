#include "cli/plan_setup.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner/cost_model/analytic_cost_model.h"
#include "planner/cost_model/profile_cost_model.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::cli {
namespace {

// A model argument is a file, or a name looked up in configs/models under the
// working directory, $DYNAPIPE_HOME, or beside this program's bin/ (an
// unpacked bundle carries configs/).
absl::StatusOr<proto::ModelSpec> LoadModel(const std::string& arg) {
  std::vector<std::string> tries = {arg};
  if (arg.find('/') == std::string::npos) {
    const std::string rel = "configs/models/" + arg + ".pbtxt";
    tries.push_back(rel);
    if (const char* home = std::getenv("DYNAPIPE_HOME")) tries.push_back(std::string(home) + "/" + rel);
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) tries.push_back((exe.parent_path().parent_path() / rel).string());
  }
  for (const std::string& path : tries) {
    if (!std::filesystem::exists(path)) continue;
    proto::ModelSpec m;
    RETURN_IF_ERROR(LoadProtoFile(path, &m));
    return m;
  }
  return absl::NotFoundError(absl::StrCat("--model: no file \"", arg, "\" and no configs/models/", arg,
                                          ".pbtxt (run from the repository root or set DYNAPIPE_HOME)"));
}

proto::ClusterSpec DefaultCluster(const proto::DeviceSpec& device) {
  proto::ClusterSpec c;
  c.set_name("default");
  c.set_num_nodes(1);
  c.set_devices_per_node(8);
  *c.mutable_device() = device;
  c.set_intra_node_bandwidth_gbps(spec::kDefaultIntraNodeBandwidthGbps);
  c.set_inter_node_bandwidth_gbps(spec::kDefaultInterNodeBandwidthGbps);
  c.set_intra_node_latency_us(5);
  c.set_inter_node_latency_us(10);
  return c;
}

}  // namespace

absl::StatusOr<proto::DeviceSpec> DevicePreset(const std::string& name) {
  proto::DeviceSpec d;
  d.set_name(name);
  if (name == "h100") {
    d.set_peak_tflops(989);
    d.set_memory_bandwidth_gbps(3350);
    d.set_memory_mb(80000);
  } else if (name == "h200") {
    d.set_peak_tflops(989);
    d.set_memory_bandwidth_gbps(4800);
    d.set_memory_mb(141000);
  } else if (name == "a100") {
    d.set_peak_tflops(312);
    d.set_memory_bandwidth_gbps(2039);
    d.set_memory_mb(80000);
  } else if (name == "cpu") {
    d.set_peak_tflops(0.1);
    d.set_memory_bandwidth_gbps(20);
    d.set_memory_mb(8000);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--device: unknown device \"", name, "\" (h100, h200, a100, cpu)"));
  }
  return d;
}

namespace {

// --cluster and --device (default: one node of 8 h100s); returns the device,
// whose memory is the default --mem-limit-mb.
absl::StatusOr<proto::DeviceSpec> ClusterFromArgs(const Args& args, proto::ClusterSpec* cluster) {
  proto::DeviceSpec device;
  if (args.Has("cluster")) {
    RETURN_IF_ERROR(LoadProtoFile(args.Str("cluster"), cluster));
    device = cluster->device();
  }
  if (args.Has("device")) {
    ASSIGN_OR_RETURN(device, DevicePreset(args.Str("device")));
    if (!args.Has("cluster")) {
      *cluster = DefaultCluster(device);
    } else {
      *cluster->mutable_device() = device;
    }
  }
  if (!args.Has("cluster") && !args.Has("device")) {
    ASSIGN_OR_RETURN(device, DevicePreset("h100"));
    *cluster = DefaultCluster(device);
  }
  return device;
}

// --stages, --dp, and the layers' placement: --layers-per-stage or --layer-to-device.
absl::Status ParallelismFromArgs(const Args& args, planner::PlannerConfig& c) {
  ASSIGN_OR_RETURN(const int64_t stages, args.Int("stages", spec::kDefaultPp));
  ASSIGN_OR_RETURN(const int64_t dp, args.Int("dp", spec::kDefaultDp));
  if (stages < 1 || stages > spec::kMaxPp) {
    return absl::InvalidArgumentError(absl::StrCat("--stages: must be in 1..", spec::kMaxPp));
  }
  if (dp < 1 || dp > spec::kMaxDp) return absl::InvalidArgumentError(absl::StrCat("--dp: must be in 1..", spec::kMaxDp));
  c.pp = static_cast<int>(stages);
  c.dp = static_cast<int>(dp);
  const int layers = c.model.num_layers() + (c.model.kind() == proto::ModelKind::t5 ? c.model.num_decoder_layers() : 0);
  ASSIGN_OR_RETURN(std::vector<int> per_stage, args.IntList("layers-per-stage"));
  ASSIGN_OR_RETURN(c.layer_to_device, args.IntList("layer-to-device"));
  if (per_stage.empty()) return absl::OkStatus();
  if (!c.layer_to_device.empty()) return absl::InvalidArgumentError("--layers-per-stage and --layer-to-device exclude each other");
  if (per_stage.size() == 1) per_stage.assign(c.pp, per_stage[0]);
  if (static_cast<int>(per_stage.size()) != c.pp) {
    return absl::InvalidArgumentError(absl::StrCat("--layers-per-stage: ", per_stage.size(), " values for ", c.pp, " stages"));
  }
  int total = 0;
  for (int d = 0; d < c.pp; ++d) {
    if (per_stage[d] <= 0) return absl::InvalidArgumentError("--layers-per-stage: values must be positive");
    total += per_stage[d];
    c.layer_to_device.insert(c.layer_to_device.end(), per_stage[d], d);
  }
  if (total != layers) {
    return absl::InvalidArgumentError(absl::StrCat("--layers-per-stage: ", total, " layers in total but model ",
                                                   c.model.name(), " has ", layers));
  }
  return absl::OkStatus();
}

// --max-seqlen, --mem-limit-mb (default: the device's), --round, --tolerance,
// --permutations, --seed, --micro-batch-size, --micro-batch-tokens, --zero1.
absl::Status LimitsFromArgs(const Args& args, const proto::DeviceSpec& device, planner::PlannerConfig& c) {
  const int64_t default_seq = c.model.max_positions() > 0 ? std::min(spec::kDefaultMaxSeqLen, c.model.max_positions())
                                                           : spec::kDefaultMaxSeqLen;
  ASSIGN_OR_RETURN(const int64_t max_seq, args.Int("max-seqlen", default_seq));
  if (max_seq < 1) return absl::InvalidArgumentError("--max-seqlen: must be positive");
  if (c.model.max_positions() > 0 && max_seq > c.model.max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat("--max-seqlen: ", max_seq, " exceeds the model's max_positions ",
                                                   c.model.max_positions()));
  }
  c.max_seq_len = static_cast<int>(max_seq);
  ASSIGN_OR_RETURN(c.memory_limit_mb, args.Double("mem-limit-mb", device.memory_mb() > 0 ? device.memory_mb() : 80000));
  if (!(c.memory_limit_mb > 0)) return absl::InvalidArgumentError("--mem-limit-mb: must be positive");
  ASSIGN_OR_RETURN(const int64_t round, args.Int("round", spec::kDefaultRoundMultiple));
  if (round < 1 || round > 4096) return absl::InvalidArgumentError("--round: must be in 1..4096");
  c.round_multiple = static_cast<int>(round);
  ASSIGN_OR_RETURN(c.tolerance, args.Double("tolerance", spec::kDefaultCapTolerance));
  if (!(c.tolerance >= 0 && c.tolerance <= 1)) return absl::InvalidArgumentError("--tolerance: must be in 0..1");
  ASSIGN_OR_RETURN(const int64_t perms, args.Int("permutations", spec::kDefaultPermutations));
  if (perms < 1 || perms > spec::kMaxCandidates) {
    return absl::InvalidArgumentError(absl::StrCat("--permutations: must be in 1..", spec::kMaxCandidates));
  }
  c.permutations = static_cast<int>(perms);
  ASSIGN_OR_RETURN(const int64_t seed, args.Int("seed", 1));
  c.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(const int64_t mbs, args.Int("micro-batch-size", 0));
  if (mbs < 0 || mbs > 1 << 20) return absl::InvalidArgumentError("--micro-batch-size: must be positive");
  c.micro_batch_size = static_cast<int>(mbs);
  ASSIGN_OR_RETURN(c.micro_batch_tokens, args.Int("micro-batch-tokens", 0));
  if (c.micro_batch_tokens < 0) return absl::InvalidArgumentError("--micro-batch-tokens: must be positive");
  c.zero1 = args.Has("zero1");
  return absl::OkStatus();
}

// The attention kernel: --attention, else the model file's, else the job default.
absl::Status AttentionFromArgs(const Args& args, planner::PlannerConfig& c) {
  proto::AttentionKernel::Value attention = c.model.attention();
  if (args.Has("attention") && (!proto::AttentionKernel::Value_Parse(args.Str("attention"), &attention) ||
                                attention == proto::AttentionKernel::unspecified)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--attention: unknown kernel \"", args.Str("attention"), "\" (varlen, materialized)"));
  }
  if (attention == proto::AttentionKernel::unspecified) attention = spec::kDefaultAttention;
  c.model.set_attention(attention);
  c.work.varlen_attention = attention == proto::AttentionKernel::varlen;
  return absl::OkStatus();
}

// --batching, --schedule and --recompute.
absl::Status MethodsFromArgs(const Args& args, planner::PlannerConfig& c) {
  const std::string batching = args.Str("batching", "dynamic");
  bool found = false;
  for (int b = 0; b < planner::kNumBatchings; ++b) {
    if (batching == planner::BatchingName(static_cast<planner::Batching>(b))) {
      c.batching = static_cast<planner::Batching>(b);
      found = true;
    }
  }
  if (!found) {
    std::vector<std::string> names;
    for (int b = 0; b < planner::kNumBatchings; ++b) names.push_back(planner::BatchingName(static_cast<planner::Batching>(b)));
    return absl::InvalidArgumentError(
        absl::StrCat("--batching: unknown method \"", batching, "\" (", absl::StrJoin(names, ", "), ")"));
  }
  for (absl::string_view part : absl::StrSplit(args.Str("ablate"), ',', absl::SkipEmpty())) {
    if (part == "baselines") {
      c.parts.baselines = false;
    } else if (part == "balanced") {
      c.parts.balanced = false;
    } else if (part == "group_balance") {
      c.parts.group_balance = false;
    } else if (part == "rebalance") {
      c.parts.rebalance = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--ablate: unknown part \"", part, "\" (baselines, balanced, group_balance, rebalance)"));
    }
  }
  const std::string schedule = args.Str("schedule", "auto");
  if (schedule == "1f1b") {
    c.policy = proto::ScheduleSpec::one_f_one_b;
  } else if (!proto::ScheduleSpec::Policy_Parse(schedule, &c.policy)) {
    return absl::InvalidArgumentError(absl::StrCat("--schedule: unknown schedule \"", schedule,
                                                   "\" (auto, 1f1b, interleaved_1f1b, wait_free_cyclic)"));
  }
  if (c.policy == proto::ScheduleSpec::unspecified) c.policy = proto::ScheduleSpec::auto_;
  const std::string recompute = args.Str("recompute", "auto");
  if (!proto::RecomputeLevel::Value_Parse(recompute, &c.recompute) ||
      c.recompute == proto::RecomputeLevel::unspecified) {
    return absl::InvalidArgumentError(absl::StrCat("--recompute: unknown level \"", recompute,
                                                   "\" (auto, none, selective, full)"));
  }
  return absl::OkStatus();
}

// A measured profile (--profile), else the analytic model of the cluster's device.
absl::StatusOr<std::shared_ptr<const planner::LayerCostModel>> CostModelFromArgs(const Args& args,
                                                                                 const planner::PlannerConfig& c) {
  if (args.Has("profile")) {
    proto::CostProfile profile;
    RETURN_IF_ERROR(LoadProtoFile(args.Str("profile"), &profile));
    auto model = planner::ProfileCostModel::Create(profile, c.model.dtype() == proto::DType::fp32 ? 4 : 2);
    if (!model.ok()) return Annotate(model.status(), args.Str("profile"));
    return std::shared_ptr<const planner::LayerCostModel>(std::move(*model));
  }
  auto model = planner::AnalyticCostModel::Create(c.model, c.cluster.device(), {});
  if (!model.ok()) return model.status();
  return std::shared_ptr<const planner::LayerCostModel>(std::move(*model));
}

}  // namespace

absl::StatusOr<PlanSetup> SetupFromArgs(const Args& args) {
  PlanSetup s;
  planner::PlannerConfig& c = s.config;
  if (!args.Has("model")) return absl::InvalidArgumentError("--model is required (a ModelSpec file or a name in configs/models)");
  ASSIGN_OR_RETURN(c.model, LoadModel(args.Str("model")));
  ASSIGN_OR_RETURN(const proto::DeviceSpec device, ClusterFromArgs(args, &c.cluster));
  RETURN_IF_ERROR(ParallelismFromArgs(args, c));
  RETURN_IF_ERROR(LimitsFromArgs(args, device, c));
  RETURN_IF_ERROR(AttentionFromArgs(args, c));
  RETURN_IF_ERROR(MethodsFromArgs(args, c));
  ASSIGN_OR_RETURN(s.cost, CostModelFromArgs(args, c));
  s.cost_description = s.cost->Describe();
  return s;
}

}  // namespace dynapipe::cli
