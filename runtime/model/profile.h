#pragma once

// Measures a GPT model's per-layer costs with the executor's own kernels (the
// CPU backend here; the CUDA backend through runtime/model/profile_cuda.h) and
// returns them as a CostProfile, the planner's measured cost model
// (planner/cost_model/profile_cost_model.h). CPU jobs then plan with what the
// CPU kernels actually cost instead of the GPU-shaped analytic model (which,
// for one, cannot know that this attention skips pairs across packed
// samples and padding).
//
// Each grid point times one micro-batch of `mbs` full rows of `seq` tokens
// (every token scored) through forward and backward of one middle encoder
// layer, of the embedding alone (a first stage with no layers) and of the
// final LayerNorm + head + loss alone (a last stage with no layers), and
// reads stored and peak activation memory from the stage's buffer pool.

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cost_profile.pb.h"
#include "runtime/model/gpt.h"

namespace dynapipe::runtime::model {

struct ProfileOptions {
  std::vector<int> seq;     // ascending, each <= max_positions
  std::vector<int> mbs;     // ascending
  int64_t max_tokens = 0;   // points with mbs * seq above are left out (0: none)
  int repetitions = 3;      // timed runs per point after one warm-up; the median is kept
  uint64_t seed = 1;
  // Called after each point: layer kind, points done, points in all.
  std::function<void(const std::string& kind, int done, int total)> progress;
};

// Sequence lengths from `step` (the planner's round_multiple) up to
// `max_seq`, about 1.5x apart: step, 2, 3, 4, 6, 8, 12, ... x step, then max_seq.
std::vector<int> ProfileSeqAxis(int step, int max_seq);
// Micro-batch sizes 1, 2, 4, ... while mbs * min_seq <= max_tokens.
std::vector<int> ProfileMbsAxis(int min_seq, int64_t max_tokens);

// What one forward + backward of a micro-batch cost on a stage.
struct StageRun {
  double fw_ms = 0;
  double bw_ms = 0;
  double stored_activation_mb = 0;  // kept from forward for backward
  double peak_activation_mb = 0;    // transient memory above the stored
};

// A pipeline stage a backend can time (see ProfileLayers).
class ProfiledStage {
 public:
  virtual ~ProfiledStage() = default;
  virtual double param_mb() const = 0;
  // Forward then backward of `batch` (the stage's input and output gradient
  // drawn from `rng` where it has them), timed with the backend's own clock.
  virtual absl::StatusOr<StageRun> Run(const TokenBatch& batch, std::mt19937_64& rng) = 0;
};

using StageFactory = std::function<absl::StatusOr<std::unique_ptr<ProfiledStage>>(const GptConfig& config,
                                                                                  const GptStage::Options& options)>;

// The grid driver: for each layer kind and grid point, one warm-up run and
// `repetitions` timed runs of a stage made by `factory`; the medians go into
// the profile, labelled `device`. INVALID_ARGUMENT for empty or unsorted
// axes, a seq beyond max_positions, or repetitions < 1.
absl::StatusOr<proto::CostProfile> ProfileLayers(const GptConfig& config, const ProfileOptions& options,
                                                 absl::string_view device, const StageFactory& factory);

// `dynapipe profile` on the CPU backend: ProfileLayers over GptStage.
absl::StatusOr<proto::CostProfile> ProfileGpt(const GptConfig& config, const ProfileOptions& options);

// `rows` full rows of `seq` random tokens, every next token scored.
TokenBatch FullRows(int rows, int seq, int vocab, std::mt19937_64& rng);

}  // namespace dynapipe::runtime::model
