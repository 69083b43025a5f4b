#include "planner/candidates.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace dynapipe::planner {

namespace {

// The `keep` best of `scored` by estimate, best first, into out.
void KeepBest(CandidateMaker::Scored scored, size_t keep, CandidateSplits& out) {
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < std::min(keep, scored.size()); ++i) out.splits.push_back(std::move(scored[i].second));
}

}  // namespace

CandidateMaker::CandidateMaker(const PlannerConfig& config, ShapeCosts& costs, std::span<const Sample> samples,
                               Recompute r, uint64_t seed)
    : config_(config), costs_(costs), samples_(samples), r_(r),
      ed_(costs.model().encoder_decoder()), order_(OrderSamples(samples, ed_, seed)) {}

absl::StatusOr<CandidateSplits> CandidateMaker::Make(Batching b) {
  CandidateSplits out;
  if (b == Batching::kDynamic) {
    DpOptions dp{config_.pp, costs_.model().chunks_per_device(), config_.dp, config_.tolerance};
    DynamicOptions opt{config_.round_multiple, config_.tolerance, 0, config_.dp_candidates};
    DynamicStats stats;
    auto result = DynamicBatches(samples_, order_, costs_, r_, dp, opt, &stats);
    if (!result.ok()) return result.status();
    out.splits = std::move(*result);
    out.memory_bound = stats.memory_bound;
    const bool varlen = config_.work.varlen_attention && !ed_;
    if (config_.parts.balanced && varlen) Balanced(out);
    // Ramped padded runs for decoder-only models (on the T5-3B-like set-ups
    // of benchmarks/plan_baselines.py they won nothing and tripled planning).
    if (config_.parts.balanced && !varlen && !ed_ && config_.pp > 1 && !out.splits.empty()) {
      const int dp_count = static_cast<int>((out.splits.front().size() + config_.dp - 1) / config_.dp);
      RampedPadded(dp_count, out);
    }
    out.own = out.splits.size();
    for (int other = 1; other < kNumBatchings && config_.parts.baselines; ++other) {
      Sizes(static_cast<Batching>(other), out);
    }
    return out;
  }
  Sizes(b, out);
  out.own = out.splits.size();
  if (out.splits.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(BatchingName(b), ": even the smallest micro-batch does not fit in ",
                                                      static_cast<int64_t>(config_.memory_limit_mb), " MB with ",
                                                      RecomputeName(r_), " recomputation"));
  }
  return out;
}

bool CandidateMaker::Add(std::vector<MicroBatch> mbs, CandidateSplits& out) {
  ApplyWork(samples_, config_.work, std::span<MicroBatch>(mbs));
  for (const MicroBatch& mb : mbs) {
    auto c = costs_.Time(mb.shape, r_);
    if (!c.ok() || !c->fits[0]) {
      out.memory_bound = true;
      return false;
    }
  }
  out.splits.push_back(std::move(mbs));
  return out.splits.back().size() > 1;
}

void CandidateMaker::Sizes(Batching b, CandidateSplits& out) {
  const int n = static_cast<int>(samples_.size());
  const bool fixed = (b == Batching::kTokenBased && config_.micro_batch_tokens > 0) ||
                     ((b == Batching::kPadding || b == Batching::kFixedMbs) && config_.micro_batch_size > 0);
  for (int64_t size = 1; size <= std::max(n, 1); size *= 2) {
    if (!Add(SplitAt(b, size), out) || fixed) break;
  }
}

std::vector<MicroBatch> CandidateMaker::SplitAt(Batching b, int64_t size) {
  const int rows = static_cast<int>(size);
  const int mbs = config_.micro_batch_size > 0 ? config_.micro_batch_size : rows;
  const int round = config_.round_multiple, len = config_.max_seq_len;
  switch (b) {
    case Batching::kPadding: return PaddingBatches(samples_, mbs, round, ed_);
    case Batching::kPacking: return PackingBatches(samples_, rows, len, round, ed_);
    case Batching::kFixedMbs: return FixedBatches(samples_, order_, mbs, round, ed_);
    case Batching::kTokenBased:
      return TokenBasedBatches(samples_, order_, config_.micro_batch_tokens > 0 ? config_.micro_batch_tokens : size * 1024,
                               round, ed_);
    case Batching::kPackingBalanced: return PackingBalancedBatches(samples_, rows, len, round, ed_, config_.dp);
    case Batching::kWlb: {
      // Without weights from the cost model WLB balances tokens.
      const CostWeights w = Weights().value_or(CostWeights{1, 0});
      return WlbBatches(samples_, rows, len, round, w, ed_, config_.dp);
    }
    case Batching::kDynamic: break;
  }
  return {};
}

void CandidateMaker::Balanced(CandidateSplits& out) {
  const std::optional<CostWeights>& w = Weights();
  if (!w.has_value()) return;
  const int D = config_.dp, S = config_.pp, C = costs_.model().chunks_per_device();
  const int most = std::max(1, static_cast<int>(samples_.size()) / D);
  // Every count up to two micro-batches per pipeline slot, then 1.5x steps.
  std::vector<int> counts;
  for (int m = 1; m <= std::min(most, 2 * S * C); ++m) counts.push_back(m);
  for (double m = 3.0 * S * C; m <= most; m *= 1.5) counts.push_back(static_cast<int>(m));
  // Per edge weight, the best few counts by the weights alone (no packing),
  // then those built and ranked by RampEstimate on the cost model.
  double total = 0;
  for (const Sample& smp : samples_) total += w->Of(smp, ed_);
  const double group_load = total / D;
  const size_t keep = static_cast<size_t>(std::max(1, config_.dp_candidates));
  Scored kept;
  std::vector<Ramp> ramps = Ramps();
  ramps.insert(ramps.begin(), Ramp{});  // even micro-batches
  for (const Ramp& ramp : ramps) {
    std::vector<std::pair<double, int>> by_weights;
    for (int m : counts) {
      if (ramp.edge < 1 && m < 3) continue;  // no ramp
      const std::vector<double> target = RampTargets(m, ramp);
      const double unit = group_load / std::accumulate(target.begin(), target.end(), 0.0);
      const double edge_ms = target.front() * unit + w->per_micro_batch_ms;
      const double work = group_load + m * w->per_micro_batch_ms;
      by_weights.push_back({work + (S - 1) * edge_ms / C, m});
    }
    std::stable_sort(by_weights.begin(), by_weights.end());
    for (size_t i = 0; i < std::min(keep, by_weights.size()); ++i) {
      Score(BalancedBatches(samples_, D, by_weights[i].second, *w, config_.max_seq_len, config_.round_multiple, ed_,
                            ramp),
            kept, out);
    }
  }
  const size_t all = kept.size();
  KeepBest(std::move(kept), all, out);
}

void CandidateMaker::RampedPadded(int dp_count, CandidateSplits& out) {
  const int S = config_.pp;
  Scored scored;
  RampedRunMaker runs(samples_, order_, config_.dp, costs_, r_, config_.round_multiple);
  for (const Ramp& ramp : Ramps()) {
    for (const int m : {dp_count + std::max(1, S / 2), dp_count + S}) {  // a ramp needs more than the DP's count
      std::vector<MicroBatch> mbs = runs.Make(m, ramp);
      if (!mbs.empty()) Score(std::move(mbs), scored, out);  // empty: too few samples per group, or one fits nowhere
    }
  }
  KeepBest(std::move(scored), static_cast<size_t>(2 * std::max(1, config_.dp_candidates)), out);
}

void CandidateMaker::Score(std::vector<MicroBatch> mbs, Scored& scored, CandidateSplits& out) {
  ApplyWork(samples_, config_.work, std::span<MicroBatch>(mbs));
  const std::optional<double> estimate = RampEstimate(mbs);
  if (!estimate.has_value()) {
    out.memory_bound = true;
    return;
  }
  scored.push_back({*estimate, std::move(mbs)});
}

std::vector<Ramp> CandidateMaker::Ramps() const {
  std::vector<Ramp> ramps;
  if (config_.pp <= 1) return ramps;  // no bubble to shorten
  // A ramp over the fill and one twice as long over the drain: a backward
  // crosses every stage in turn, so a heavy micro-batch late in the order
  // holds up the first stage's drain. On benchmarks/plan_baselines.py and
  // planner_benchmark's set-ups these three did as well as, or better than,
  // nine shapes (light first and last only, symmetric ramps, these) at a
  // third of the candidates: the estimate that ranks the kept splits
  // (RampEstimate) dropped good ones among nine.
  const int fill = std::max(2, (config_.pp - 1) / costs_.model().chunks_per_device());
  for (const double edge : {0.5, 0.25, 0.1}) ramps.push_back(Ramp{edge, fill, 2 * fill});
  return ramps;
}

std::optional<double> CandidateMaker::RampEstimate(std::span<const MicroBatch> mbs) {
  const int S = config_.pp, C = costs_.model().chunks_per_device();
  std::vector<double> sum(config_.dp, 0), first(config_.dp, -1), last(config_.dp, 0);
  for (const MicroBatch& mb : mbs) {
    auto t = costs_.Time(mb.shape, r_);
    if (!t.ok() || !t->fits[0]) return std::nullopt;
    const int g = std::max(0, mb.group);
    sum[g] += t->time_ms;
    if (first[g] < 0) first[g] = t->time_ms;
    last[g] = t->time_ms;
  }
  // Per group: its work on one device plus the fill behind the first
  // micro-batch's forward and the drain behind the last one's backward
  // (backward about twice forward).
  double slowest = 0;
  for (int g = 0; g < config_.dp; ++g) {
    slowest = std::max(slowest, sum[g] + (S - 1) * (std::max(0.0, first[g]) + 2 * last[g]) / (3.0 * C));
  }
  return slowest;
}

const std::optional<CostWeights>& CandidateMaker::Weights() {
  if (!weights_done_) {
    weights_done_ = true;
    auto w = CostWeightsOf(costs_, r_, config_.max_seq_len, config_.round_multiple);
    if (w.ok()) weights_ = *w;
  }
  return weights_;
}

}  // namespace dynapipe::planner
