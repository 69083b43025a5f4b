#pragma once

// The one place a JobSpec's defaults are declared and its fields checked.
// NormalizeJobSpec runs where a spec enters the system (Submit, `dynapipe
// submit`, a spec file, a local run, a stored spec an executor or planner
// loads) and returns the spec with every default written out, wrapped as a
// NormalizedJobSpec: code downstream takes that type, reads plain fields and
// never normalises again or substitutes a default of its own. It is pure (no
// I/O): checks that need files (the path under --data_root, the dataset's
// vocabulary) live with the file readers (ConfineJobPaths below).

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace dynapipe::spec {

// Defaults (what a 0 / empty / unspecified field means).
// cluster.device.name of CPU devices (the cpu backend): their memory is the
// host's, so the planner also counts what executors keep in host memory.
inline constexpr std::string_view kCpuDeviceName = "cpu";
inline constexpr int kDefaultPp = 1;
inline constexpr int kDefaultDp = 1;
inline constexpr double kDefaultGradBucketMb = 25;  // as PyTorch DDP's bucket_cap_mb
inline constexpr int64_t kDefaultGlobalBatchTokens = 65536;
inline constexpr int kDefaultMaxSeqLen = 2048;  // or model.max_positions when smaller
inline constexpr int kDefaultRoundMultiple = 8;
inline constexpr proto::AttentionKernel::Value kDefaultAttention = proto::AttentionKernel::varlen;
// model.block per model kind: GPT-2's block, T5's (v1.0) and Llama's.
inline constexpr proto::NormKind::Value kDefaultGptNorm = proto::NormKind::layernorm;
inline constexpr proto::MlpKind::Value kDefaultGptMlp = proto::MlpKind::gelu;
inline constexpr bool kDefaultGptBias = true;
inline constexpr proto::NormKind::Value kDefaultT5Norm = proto::NormKind::rmsnorm;
inline constexpr proto::MlpKind::Value kDefaultT5Mlp = proto::MlpKind::relu;
inline constexpr bool kDefaultT5Bias = false;
inline constexpr proto::NormKind::Value kDefaultLlamaNorm = proto::NormKind::rmsnorm;
inline constexpr proto::MlpKind::Value kDefaultLlamaMlp = proto::MlpKind::swiglu;
inline constexpr bool kDefaultLlamaBias = false;
// model.block.norm_eps: LayerNorm's 1e-5 (GPT-2), RMS norm's 1e-6 (T5),
// and 1e-5 for every Llama norm (Llama 2's rms_norm_eps).
inline constexpr double kDefaultLayerNormEps = 1e-5;
inline constexpr double kDefaultRmsNormEps = 1e-6;
inline constexpr double kDefaultLlamaNormEps = 1e-5;
// model.block.rope_base (rotary positions): RoPE's 10000 (Llama 2's rope_theta).
inline constexpr double kDefaultRopeBase = 10000;
inline constexpr double kDefaultCapTolerance = 0.02;
inline constexpr int kDefaultDpCandidates = 3;
inline constexpr int kDefaultPermutations = 4;
inline constexpr int kDefaultPlannerLookahead = 4;
inline constexpr proto::CostRefitSpec::Mode kDefaultCostRefit = proto::CostRefitSpec::off;
inline constexpr int kDefaultRefitWindow = 8;
inline constexpr int kDefaultRefitMinIterations = 3;
inline constexpr double kDefaultRefitMaxStep = 2.0;
inline constexpr double kDefaultLr = 3e-4;
inline constexpr double kDefaultBeta1 = 0.9;
inline constexpr double kDefaultBeta2 = 0.95;
inline constexpr double kDefaultEps = 1e-8;
inline constexpr double kDefaultWeightDecay = 0.1;
inline constexpr int kDefaultNumNodes = 1;
inline constexpr int kDefaultDevicesPerNode = 1;
inline constexpr double kDefaultIntraNodeBandwidthGbps = 2400;  // NVLink-class, Gbit/s
inline constexpr double kDefaultInterNodeBandwidthGbps = 400;   // one 400G NIC per device
// model.ffn: 4 * model.hidden; model.max_positions: batching.max_seq_len;
// batching.method, schedule.policy, schedule.recompute: the first real value
// of each enum (dynamic, auto, auto); dataset.format: lengths;
// optimizer.lr_schedule.kind: constant, decay_iters: the job's iterations;
// memory_limit_mb: cluster.device.memory_mb.

// Upper bounds: far above any real job, low enough that arithmetic on them
// cannot overflow and that no handler allocates more than a few MB for them.
inline constexpr int kMaxNameBytes = 256;
inline constexpr int kMaxPathBytes = 4096;
inline constexpr int kMaxLayers = 4096;
inline constexpr int kMaxHidden = 1 << 16;
inline constexpr int kMaxHeads = 1 << 10;
inline constexpr int kMaxFfn = 1 << 20;
inline constexpr int kMaxVocab = 1 << 24;
inline constexpr int kMaxPositions = 1 << 20;
inline constexpr int kMaxPp = 4096;
inline constexpr int kMaxDp = 1 << 16;
inline constexpr double kMaxGradBucketMb = 1 << 20;
inline constexpr int kMaxWorld = 1 << 20;
inline constexpr int64_t kMaxBatchTokens = int64_t{1} << 34;
// Planning work grows faster than the samples of a global batch (`dynapipe
// plan --iters 1`, GPT-6.7B on 4 stages, FLAN-like lengths, one core: 1.1 s
// at 12k samples, 7.4 s at 48k, 17.8 s at 96k): a job whose global batches
// hold more samples is refused at submit.
inline constexpr int64_t kMaxSamplesPerGlobalBatch = 16384;
inline constexpr int kMaxMicroBatchSize = 1 << 20;
inline constexpr int kMaxCandidates = 64;
inline constexpr int64_t kMaxIterations = 1'000'000'000;
inline constexpr int kMaxLookahead = 1024;
inline constexpr int kMaxNodes = 1 << 16;
inline constexpr int kMaxDevicesPerNode = 1024;
inline constexpr double kMaxMemoryMb = 1 << 24;  // 16 TB
inline constexpr double kMaxTflops = 1e6;
inline constexpr double kMaxBandwidth = 1e7;      // GB/s or Gbit/s
inline constexpr double kMaxLatencyUs = 1e7;      // 10 s
inline constexpr double kMaxLr = 10;
inline constexpr double kMaxWeightDecay = 10;

// Fills every default and checks every field. INVALID_ARGUMENT names the
// first offending field ("optimizer.beta1: must be in [0, 1), got 1.5").
// Idempotent: normalising a normalised spec returns it unchanged.
absl::StatusOr<proto::JobSpec> NormalizeJobSpec(proto::JobSpec spec);

// A spec NormalizeJobSpec accepted. Only Normalize makes one, so holding one
// proves the spec was normalised once, where it entered.
class NormalizedJobSpec {
 public:
  static absl::StatusOr<NormalizedJobSpec> Normalize(proto::JobSpec spec);
  const proto::JobSpec& proto() const { return spec_; }
  const proto::JobSpec* operator->() const { return &spec_; }

 private:
  explicit NormalizedJobSpec(proto::JobSpec spec) : spec_(std::move(spec)) {}
  proto::JobSpec spec_;
};

// A job spec file (text proto or JSON), normalised; errors name the file.
absl::StatusOr<NormalizedJobSpec> LoadJobSpec(const std::string& path);

// The files a job names, confined to `data_root` (ConfinedPath: no ".." and
// no link leads out); each error names its field. Empty when the field is
// unset (checkpoint.dir, cost_profile_path). The one place the planner and
// the executors confine a job's paths.
struct JobPaths {
  std::string checkpoint_dir;
  std::string init_from;  // model.init_from; empty when unset
  std::string export_dir;  // export_dir; empty when unset
  std::string cost_profile;
  std::string dataset;
};
absl::StatusOr<JobPaths> ConfineJobPaths(const NormalizedJobSpec& spec, const std::string& data_root);

// OK when `path` can name a file under a root: non-empty, at most
// kMaxPathBytes, no NUL or control characters, no ".." component.
// `field` prefixes the error ("dataset.path: ...").
absl::Status CheckJobPath(absl::string_view field, absl::string_view path);

}  // namespace dynapipe::spec
