#include "runtime/model/profile.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/memory/buffer_pool.h"
#include "src/common/stats.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Kind {
  proto::LayerProfile::Kind kind;
  GptStage::Options stage;
};

}  // namespace

TokenBatch FullRows(int rows, int seq, int vocab, std::mt19937_64& rng) {
  TokenBatch b;
  b.rows = rows;
  b.seq = seq;
  const size_t n = static_cast<size_t>(rows) * seq;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  b.tokens.resize(n);
  b.positions.resize(n);
  b.segments.assign(n, 0);
  b.targets.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b.tokens[i] = token(rng);
    b.positions[i] = static_cast<int32_t>(i % seq);
    b.targets[i] = token(rng);
  }
  b.real_tokens = b.loss_tokens = static_cast<int64_t>(n);
  return b;
}

std::vector<int> ProfileSeqAxis(int step, int max_seq) {
  std::vector<int> out;
  if (step <= 0 || max_seq <= 0) return out;
  for (int base = 1;; base *= 2) {
    for (const int v : {base * step, base > 1 ? base * step * 3 / 2 : step}) {
      if (v >= max_seq) {
        out.push_back(max_seq);
        return out;
      }
      if (out.empty() || v > out.back()) out.push_back(v);
    }
  }
}

std::vector<int> ProfileMbsAxis(int min_seq, int64_t max_tokens) {
  std::vector<int> out = {1};
  while (min_seq > 0 && static_cast<int64_t>(out.back()) * 2 * min_seq <= max_tokens) out.push_back(out.back() * 2);
  return out;
}

absl::StatusOr<proto::CostProfile> ProfileLayers(const GptConfig& config, const ProfileOptions& options,
                                                 absl::string_view device, const StageFactory& factory) {
  const auto sorted = [](const std::vector<int>& v) {
    return !v.empty() && v.front() > 0 && std::is_sorted(v.begin(), v.end()) &&
           std::adjacent_find(v.begin(), v.end()) == v.end();
  };
  if (!sorted(options.seq)) return absl::InvalidArgumentError("profile seq: must be positive and ascending");
  if (!sorted(options.mbs)) return absl::InvalidArgumentError("profile mbs: must be positive and ascending");
  if (options.seq.back() > config.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("profile seq: ", options.seq.back(), " exceeds the model's ",
                                                   config.max_positions, " positions"));
  }
  if (options.repetitions < 1) return absl::InvalidArgumentError("profile repetitions: must be at least 1");
  const auto included = [&](int mbs, int seq) {
    return options.max_tokens <= 0 || static_cast<int64_t>(mbs) * seq <= options.max_tokens;
  };
  int total = 0;
  for (int s : options.seq) {
    for (int m : options.mbs) total += included(m, s) ? 1 : 0;
  }
  if (total == 0) return absl::InvalidArgumentError("profile: no grid point within max_tokens");

  // One layer costs the same at any depth: the encoder is timed as the middle
  // stage of a three-layer model, so it is neither first nor last.
  const int L = config.num_layers;
  const std::vector<Kind> kinds = {
      {proto::LayerProfile::encoder, {1, 1, false, false, options.seed}},
      {proto::LayerProfile::embedding, {0, 0, true, false, options.seed}},
      {proto::LayerProfile::postprocess, {L, 0, false, true, options.seed}},
  };
  proto::CostProfile profile;
  profile.set_device(std::string(device));
  profile.set_hidden(config.hidden);
  profile.set_heads(config.heads);
  profile.set_ffn(config.ffn);
  profile.set_max_tokens(options.max_tokens);
  std::mt19937_64 rng(options.seed);
  for (const Kind& k : kinds) {
    GptConfig c = config;
    if (k.kind == proto::LayerProfile::encoder) c.num_layers = 3;
    ASSIGN_OR_RETURN(std::unique_ptr<ProfiledStage> stage, factory(c, k.stage));
    proto::LayerProfile* layer = profile.add_layers();
    layer->set_kind(k.kind);
    layer->set_param_mb(stage->param_mb());
    const std::string name = proto::LayerProfile::Kind_Name(k.kind);
    int done = 0;
    for (int m : options.mbs) {
      for (int s : options.seq) {
        if (!included(m, s)) continue;
        const TokenBatch batch = FullRows(m, s, config.vocab, rng);
        std::vector<double> fw, bw;
        StageRun last;
        for (int rep = 0; rep <= options.repetitions; ++rep) {
          ASSIGN_OR_RETURN(last, stage->Run(batch, rng));
          if (rep == 0) continue;  // warm-up: first touches of pool and caches
          fw.push_back(last.fw_ms);
          bw.push_back(last.bw_ms);
        }
        proto::CostPoint* p = layer->add_points();
        p->set_mbs(m);
        p->set_seq(s);
        p->set_fw_ms(Median(fw));
        p->set_bw_ms(Median(bw));
        p->set_stored_activation_mb(last.stored_activation_mb);
        p->set_peak_activation_mb(last.peak_activation_mb);
        if (options.progress) options.progress(name, ++done, total);
      }
    }
  }
  return profile;
}

namespace {

// The CPU stage: wall-clock times (the kernels run on the calling thread)
// and the host buffer pool's counters.
class CpuProfiledStage final : public ProfiledStage {
 public:
  static absl::StatusOr<std::unique_ptr<ProfiledStage>> Create(const GptConfig& config,
                                                               const GptStage::Options& options) {
    auto self = std::unique_ptr<CpuProfiledStage>(new CpuProfiledStage());
    ASSIGN_OR_RETURN(self->stage_, GptStage::Create(config, options, &self->pool_));
    return std::unique_ptr<ProfiledStage>(std::move(self));
  }
  double param_mb() const override { return static_cast<double>(stage_->param_data().size()) * sizeof(float) / 1e6; }

  absl::StatusOr<StageRun> Run(const TokenBatch& batch, std::mt19937_64& rng) override {
    const GptStage::Options& o = stage_->options();
    const size_t hidden = static_cast<size_t>(batch.rows * batch.seq) * stage_->config().hidden;
    std::vector<float> in(o.first ? 0 : hidden), out(o.last ? 0 : hidden), dout(o.last ? 0 : hidden),
        din(o.first ? 0 : hidden);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : in) v = normal(rng);
    for (float& v : dout) v = normal(rng) * 1e-3f;
    RETURN_IF_ERROR(stage_->ZeroGrads());
    const size_t base = pool_.stats().in_use_bytes;
    pool_.ResetPeak();
    StageRun r;
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(stage_->ForwardLoss(0, batch, o.first ? nullptr : in.data(), o.last ? nullptr : out.data(),
                                        1.0f / static_cast<float>(batch.loss_tokens))
                        .status());
    r.fw_ms = MsSince(t0);
    const size_t stored = pool_.stats().in_use_bytes - base;
    const auto t1 = Clock::now();
    RETURN_IF_ERROR(stage_->Backward(0, o.last ? nullptr : dout.data(), o.first ? nullptr : din.data()));
    r.bw_ms = MsSince(t1);
    r.stored_activation_mb = stored / 1e6;
    r.peak_activation_mb =
        std::max<double>(0, static_cast<double>(pool_.stats().peak_in_use_bytes - base) - stored) / 1e6;
    return r;
  }

 private:
  CpuProfiledStage() : pool_(CpuAllocator()) {}
  BufferPool pool_;
  std::unique_ptr<GptStage> stage_;
};

}  // namespace

absl::StatusOr<proto::CostProfile> ProfileGpt(const GptConfig& config, const ProfileOptions& options) {
  return ProfileLayers(config, options, "cpu", &CpuProfiledStage::Create);
}

}  // namespace dynapipe::runtime::model
