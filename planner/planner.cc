#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "planner/candidates.h"
#include "planner/plan/instructions.h"
#include "planner/plan/validate.h"
#include "planner/schedule_search.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::planner {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Recomputation levels to try, least recomputation first.
std::vector<Recompute> LevelsOf(proto::RecomputeLevel::Value recompute) {
  switch (recompute) {
    case proto::RecomputeLevel::none: return {Recompute::kNone};
    case proto::RecomputeLevel::selective: return {Recompute::kSelective};
    case proto::RecomputeLevel::full: return {Recompute::kFull};
    default: return {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  }
}

SearchOptions SearchOptionsOf(const PlannerConfig& config, uint64_t seed) {
  SearchOptions search;
  search.permutations = config.permutations;
  search.seed = seed;
  for (int k = 0; k < kNumScheduleKinds; ++k) search.try_kind[k] = config.policy == proto::ScheduleSpec::auto_;
  if (config.policy == proto::ScheduleSpec::one_f_one_b) search.try_kind[0] = true;
  if (config.policy == proto::ScheduleSpec::interleaved_1f1b) search.try_kind[1] = true;
  if (config.policy == proto::ScheduleSpec::wait_free_cyclic) search.try_kind[2] = true;
  return search;
}

// INTERNAL when the generated plans fail ValidatePlans against the samples.
absl::Status ValidateGenerated(std::span<const Sample> samples, IterationPlan& best) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> ids;
  ids.reserve(samples.size());
  for (const Sample& s : samples) ids.push_back(s.id);
  // BuildGroupPlans sealed them: their checksums hold by construction.
  const absl::Status v = ValidatePlans(best.plans, ids, {.checksums = false});
  best.timings.validate_ms = MsSince(t0);
  if (!v.ok()) return absl::InternalError(absl::StrCat("generated plan failed validation: ", v.message()));
  return absl::OkStatus();
}


}  // namespace

absl::StatusOr<Batching> BatchingOf(proto::BatchingSpec::Method m) {
  switch (m) {
    case proto::BatchingSpec::dynamic: return Batching::kDynamic;
    case proto::BatchingSpec::packing: return Batching::kPacking;
    case proto::BatchingSpec::padding: return Batching::kPadding;
    case proto::BatchingSpec::token_based: return Batching::kTokenBased;
    case proto::BatchingSpec::fixed_mbs: return Batching::kFixedMbs;
    case proto::BatchingSpec::packing_balanced: return Batching::kPackingBalanced;
    case proto::BatchingSpec::wlb: return Batching::kWlb;
    default: break;
  }
  return absl::InvalidArgumentError("batching.method: unknown value");
}

absl::StatusOr<PlannerConfig> PlannerConfigFromJob(const spec::NormalizedJobSpec& spec) {
  const proto::JobSpec& job = spec.proto();
  PlannerConfig c;
  c.job_id = job.name().empty() ? "offline" : job.name();
  c.model = job.model();
  c.pp = job.parallelism().pp();
  c.dp = job.parallelism().dp();
  c.layer_to_device.assign(job.parallelism().layer_to_device().begin(), job.parallelism().layer_to_device().end());
  const auto& b = job.batching();
  ASSIGN_OR_RETURN(c.batching, BatchingOf(b.method()));
  c.round_multiple = b.round_multiple();
  c.max_seq_len = b.max_seq_len();
  c.micro_batch_size = b.micro_batch_size();
  c.micro_batch_tokens = b.micro_batch_tokens();
  c.tolerance = b.cap_tolerance();
  c.dp_candidates = b.dp_candidates();
  c.policy = job.schedule().policy();
  c.recompute = job.schedule().recompute();
  c.permutations = job.schedule().permutations();
  c.seed = job.seed();
  c.cluster = job.cluster();
  c.memory_limit_mb = job.memory_limit_mb();
  c.zero1 = job.optimizer().zero1();
  c.checkpoint_copy_on_device = job.cluster().device().name() == spec::kCpuDeviceName && !job.checkpoint().dir().empty() &&
                                job.checkpoint().interval() > 0;
  c.work.varlen_attention = job.model().attention() == proto::AttentionKernel::varlen;
  return c;
}

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(const PlannerConfig& config,
                                                         std::shared_ptr<const LayerCostModel> cost) {
  MemoryOptions mem;
  mem.limit_mb = config.memory_limit_mb;
  mem.dp = config.dp;
  mem.zero1 = config.zero1;
  mem.weight_bytes = config.model.dtype() == proto::DType::fp32 ? 4 : 2;
  mem.checkpoint_copy = config.checkpoint_copy_on_device;
  ASSIGN_OR_RETURN(PipelineModel pm,
                   PipelineModel::Create(config.model, config.pp, config.layer_to_device, std::move(cost), mem,
                                         config.work));
  if (config.policy == proto::ScheduleSpec::one_f_one_b && pm.interleaved()) {
    return absl::InvalidArgumentError("schedule.policy: 1f1b needs one layer range per device");
  }
  if (config.policy == proto::ScheduleSpec::interleaved_1f1b && !pm.interleaved()) {
    return absl::InvalidArgumentError("schedule.policy: interleaved_1f1b needs an interleaved layer_to_device");
  }
  return std::unique_ptr<Planner>(new Planner(config, std::make_shared<PipelineModel>(std::move(pm))));
}

std::unique_ptr<Planner> Planner::ForJob(const std::string& job_id) const {
  PlannerConfig config = config_;
  config.job_id = job_id;
  return std::unique_ptr<Planner>(new Planner(std::move(config), model_));
}

Planner::Planner(PlannerConfig config, std::shared_ptr<const PipelineModel> model)
    : config_(std::move(config)), model_(std::move(model)), comm_(config_.cluster),
      costs_(std::make_unique<ShapeCosts>(model_)) {}

std::vector<std::vector<int>> Planner::SplitGroups(std::span<const MicroBatch> mbs, Recompute r) const {
  const int D = config_.dp;
  std::vector<std::vector<int>> groups(D);
  const bool chosen = config_.parts.group_balance && !mbs.empty() &&
                      std::all_of(mbs.begin(), mbs.end(), [D](const MicroBatch& mb) { return mb.group >= 0 && mb.group < D; });
  if (chosen) {
    for (size_t i = 0; i < mbs.size(); ++i) groups[mbs[i].group].push_back(static_cast<int>(i));
    return groups;
  }
  if (D == 1) {
    for (size_t i = 0; i < mbs.size(); ++i) groups[0].push_back(static_cast<int>(i));
    return groups;
  }
  // Longest-processing-time first onto the least loaded group, then each
  // group keeps the original (length) order.
  std::vector<std::pair<double, int>> by_time;
  for (size_t i = 0; i < mbs.size(); ++i) {
    auto c = costs_->Time(mbs[i].shape, r);
    by_time.push_back({c.ok() ? c->time_ms : 0.0, static_cast<int>(i)});
  }
  std::sort(by_time.begin(), by_time.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<double> load(D, 0);
  for (const auto& [t, i] : by_time) {
    const int g = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[g] += t;
    groups[g].push_back(i);
  }
  for (auto& g : groups) std::sort(g.begin(), g.end());
  return groups;
}

absl::StatusOr<IterationPlan> Planner::Plan(std::span<const Sample> samples, int64_t iteration,
                                            const PlanRequest& request) const {
  return Plan(samples, iteration, config_.batching, request);
}

// The schedule search's state across recomputation levels and candidate
// splits: the best plan so far, its schedules and what the search cost.
struct Planner::Search {
  Batching batching = Batching::kDynamic;
  SearchOptions options;
  IterationPlan best;
  std::vector<GroupSchedule> best_groups;
  std::vector<PipelineTimes> best_times;
  // The best split's micro-batches, costs and simulator inputs per group, in
  // the partitioner's order (kept only for Rebalance).
  bool keep_split = false;
  Candidate best_split;
  absl::Status last_error = absl::OkStatus();
  double partition_ms = 0, schedule_ms = 0;
  int simulations = 0, candidates = 0, pruned = 0;
};

bool Planner::SearchLevel(std::span<const Sample> samples, uint64_t seed, Recompute r, Search& s) const {
  ++s.best.recompute_levels_tried;
  auto t0 = std::chrono::steady_clock::now();
  CandidateMaker maker(config_, *costs_, samples, r, seed);
  auto candidates = maker.Make(s.batching);
  s.partition_ms += MsSince(t0);
  if (!candidates.ok()) {
    s.last_error = candidates.status();
    return false;
  }
  t0 = std::chrono::steady_clock::now();
  // Every split's groups and per-device lower bound first (from cached
  // costs), then best-first on bounds: the split with the lowest bound is
  // taken; if that bound is only the per-device one, the tighter chain bound
  // over its simulator inputs (OrdersToSearch) replaces it and the split
  // goes back; otherwise it is searched. Splits are searched in order of
  // their chain bounds, and once the lowest bound cannot beat the plan in
  // hand no split can; a split is tightened only when its per-device bound
  // could still win.
  std::vector<Candidate> prepared;
  bool all_found = true;
  for (size_t k = 0; k < candidates->splits.size(); ++k) {
    std::optional<Candidate> c = Prepare(std::move(candidates->splits[k]), r, s);
    if (c.has_value()) {
      c->own = s.batching == Batching::kDynamic && k < candidates->own;
      prepared.push_back(std::move(*c));
    } else {
      all_found = false;
    }
  }
  using Entry = std::pair<double, size_t>;  // (bound, index): ties in index order
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  for (size_t k = 0; k < prepared.size(); ++k) queue.push({prepared[k].bound, k});
  const double allreduce = AllReduceMs();
  int memory_rejections = 0;
  while (!queue.empty()) {
    const auto [bound, k] = queue.top();
    // The margin keeps rounding from skipping an equal plan.
    if ((bound + allreduce) * (1 - 1e-9) > s.best.predicted_ms) {
      s.pruned += static_cast<int>(queue.size());
      break;
    }
    queue.pop();
    Candidate& c = prepared[k];
    if (c.times.empty()) {
      Tighten(c, s.options);
      queue.push({c.bound, k});
      continue;
    }
    if (!SearchCandidate(c, r, allreduce, s, &memory_rejections)) all_found = false;
  }
  s.schedule_ms += MsSince(t0);
  return !candidates->memory_bound && memory_rejections == 0 && all_found;
}

std::optional<Planner::Candidate> Planner::Prepare(std::vector<MicroBatch> mbs, Recompute r, Search& s) const {
  const int D = config_.dp;
  ++s.candidates;
  const auto split = SplitGroups(mbs, r);
  Candidate c;
  c.costs.resize(D);
  c.group_mbs.resize(D);
  for (int g = 0; g < D; ++g) {
    c.group_mbs[g].reserve(split[g].size());
    for (int i : split[g]) c.group_mbs[g].push_back(std::move(mbs[i]));
    auto costs = CostsOf(c.group_mbs[g], *costs_, r);
    if (!costs.ok()) {
      s.last_error = costs.status();
      return std::nullopt;
    }
    c.costs[g] = std::move(*costs);
    c.bound = std::max(c.bound, MakespanLowerBound(c.costs[g], *model_));
  }
  return c;
}

void Planner::Tighten(Candidate& c, const SearchOptions& options) const {
  const int D = config_.dp;
  c.times.resize(D);
  c.orders.resize(D);
  for (int g = 0; g < D; ++g) {
    c.times[g] = GroupTimes(c.group_mbs[g], c.costs[g], *model_, comm_, g);
    c.orders[g] = OrdersToSearch(c.times[g], options);
    c.bound = std::max(c.bound, c.orders[g].lower_bound);
  }
}

bool Planner::SearchCandidate(Candidate& c, Recompute r, double allreduce, Search& s, int* memory_rejections) const {
  const int D = config_.dp;
  std::vector<GroupSchedule> found(D);
  double slowest = 0;
  for (int g = 0; g < D; ++g) {
    found[g] = SearchSchedule(c.times[g], c.orders[g], config_.memory_limit_mb, s.options);
    s.simulations += found[g].simulations;
    *memory_rejections += found[g].memory_rejections;
    if (!found[g].found) {
      if (s.last_error.ok()) {
        s.last_error = absl::FailedPreconditionError(absl::StrCat(
            BatchingName(s.batching), " with ", RecomputeName(r), " recomputation: no schedule fits in ",
            static_cast<int64_t>(config_.memory_limit_mb), " MB per device"));
      }
      return false;
    }
    slowest = std::max(slowest, found[g].makespan_ms);
  }
  if (slowest + allreduce < s.best.predicted_ms) {
    s.best.predicted_ms = slowest + allreduce;
    s.best.own_split = c.own;
    s.best.allreduce_ms = allreduce;
    s.best.recompute = r;
    s.best.groups.assign(D, {});
    for (int g = 0; g < D; ++g) {
      for (int i : found[g].order) s.best.groups[g].push_back(c.group_mbs[g][i]);
    }
    s.best_groups = std::move(found);
    s.best_times = c.times;
    if (s.keep_split) s.best_split = c;
  }
  return true;
}

void Planner::Rebalance(Search& s) const {
  const int D = config_.dp, C = model_->num_chunks();
  constexpr int kRounds = 8, kTradesPerRound = 48;
  for (int round = 0; round < kRounds; ++round) {
    int a = 0, b = 0;  // slowest, fastest
    for (int g = 1; g < D; ++g) {
      if (s.best_groups[g].makespan_ms > s.best_groups[a].makespan_ms) a = g;
      if (s.best_groups[g].makespan_ms < s.best_groups[b].makespan_ms) b = g;
    }
    if (round == 0) s.best.rebalanced_ms.push_back(s.best_groups[a].makespan_ms);
    const double gap = s.best_groups[a].makespan_ms - s.best_groups[b].makespan_ms;
    if (gap <= 1e-3 * s.best_groups[a].makespan_ms) return;
    // A micro-batch's work per device; a trade moving about half the gap
    // evens the two groups best.
    auto work = [&](int g, int m) {
      if (m < 0) return 0.0;
      double w = 0;
      for (int c = 0; c < C; ++c) w += s.best_split.costs[g].At(m, c).fw_ms + s.best_split.costs[g].At(m, c).bw_ms;
      return w / model_->num_devices();
    };
    struct Trade {
      double miss;
      int i, j;
    };
    std::vector<Trade> trades;
    const int na = static_cast<int>(s.best_split.group_mbs[a].size());
    const int nb = static_cast<int>(s.best_split.group_mbs[b].size());
    for (int i = 0; i < na && na > 1; ++i) {
      for (int j = -1; j < nb; ++j) {
        const double moved = work(a, i) - work(b, j);
        if (moved > 0 && moved < gap) trades.push_back({std::abs(moved - gap / 2), i, j});
      }
    }
    const size_t n = std::min<size_t>(kTradesPerRound, trades.size());
    std::partial_sort(trades.begin(), trades.begin() + n, trades.end(), [](const Trade& x, const Trade& y) {
      return x.miss != y.miss ? x.miss < y.miss : (x.i != y.i ? x.i < y.i : x.j < y.j);
    });
    bool kept = false;
    for (size_t k = 0; k < n && !kept; ++k) kept = TryTrade(s, a, b, trades[k].i, trades[k].j);
    if (!kept) return;
  }
}

bool Planner::TryTrade(Search& s, int a, int b, int i, int j) const {
  const Candidate& c = s.best_split;
  // Both groups' micro-batches after the trade, in partition order.
  std::vector<MicroBatch> mbs[2];
  auto append = [&](int side, int g, int m) {
    mbs[side].push_back(c.group_mbs[g][m]);
    mbs[side].back().group = mbs[side].back().group >= 0 ? (side == 0 ? a : b) : -1;
  };
  const int na = static_cast<int>(c.group_mbs[a].size()), nb = static_cast<int>(c.group_mbs[b].size());
  for (int m = 0; m < na; ++m) {
    if (m != i) append(0, a, m);
    else if (j >= 0) append(0, b, j);
  }
  // A moved micro-batch keeps its relative place in the other group's order.
  const int at = j >= 0 ? j : static_cast<int>((static_cast<int64_t>(i) * (nb + 1) + na / 2) / na);
  for (int m = 0; m <= nb; ++m) {
    if (m == at) append(1, a, i);
    if (m < nb && m != j) append(1, b, m);
  }
  const double slowest = s.best_groups[a].makespan_ms;
  GroupCosts costs[2];
  PipelineTimes times[2];
  SearchOrders orders[2];
  for (int side = 0; side < 2; ++side) {
    auto cost = CostsOf(mbs[side], *costs_, s.best.recompute);  // every shape was priced for the split
    if (!cost.ok()) return false;
    costs[side] = std::move(*cost);
    times[side] = GroupTimes(mbs[side], costs[side], *model_, comm_, side == 0 ? a : b);
    orders[side] = OrdersToSearch(times[side], s.options);
    if (orders[side].lower_bound >= slowest) return false;
  }
  GroupSchedule found[2];
  for (int side = 0; side < 2; ++side) {
    found[side] = SearchSchedule(times[side], orders[side], config_.memory_limit_mb, s.options);
    s.simulations += found[side].simulations;
    if (!found[side].found || found[side].makespan_ms >= slowest * (1 - 1e-9)) return false;
  }
  double now = 0;
  for (int side = 0; side < 2; ++side) {
    const int g = side == 0 ? a : b;
    s.best.groups[g].clear();
    for (int m : found[side].order) s.best.groups[g].push_back(mbs[side][m]);
    s.best_groups[g] = std::move(found[side]);
    s.best_times[g] = times[side];
    s.best_split.group_mbs[g] = std::move(mbs[side]);
    s.best_split.costs[g] = std::move(costs[side]);
    s.best_split.times[g] = std::move(times[side]);
  }
  for (const GroupSchedule& f : s.best_groups) now = std::max(now, f.makespan_ms);
  s.best.predicted_ms = now + s.best.allreduce_ms;
  s.best.rebalanced_ms.push_back(now);
  return true;
}

double Planner::AllReduceMs() const {
  const int D = config_.dp, S = config_.pp;
  const double iteration_overhead_ms = model_->cost_model().Overheads().iteration_ms;
  // A measured per-iteration term (all-reduce, optimizer step and the rest)
  // replaces the modelled all-reduce.
  double allreduce = std::max(0.0, iteration_overhead_ms);
  for (int d = 0; d < S && D > 1 && iteration_overhead_ms < 0; ++d) {
    std::vector<int> ranks;
    for (int g = 0; g < D; ++g) ranks.push_back(g * S + d);
    allreduce = std::max(allreduce, comm_.AllReduceMs(ranks, model_->GradientMb(d)));
  }
  return allreduce;
}

absl::Status Planner::Resimulate(const Search& s, bool record, IterationPlan& best) const {
  const int D = config_.dp, S = config_.pp;
  best.peak_mb.assign(S, 0);
  for (int g = 0; g < D; ++g) {
    best.schedules.push_back(s.best_groups[g].kind);
    const PipelineTimes t = Permute(s.best_times[g], s.best_groups[g].order);
    auto sim = Simulate(t, s.best_groups[g].device_orders, record);
    if (!sim.ok()) return absl::InternalError(absl::StrCat("re-simulating the chosen schedule: ", sim.status().message()));
    for (int d = 0; d < S; ++d) best.peak_mb[d] = std::max(best.peak_mb[d], sim->peak_mb[d]);
    best.sims.push_back(std::move(*sim));
  }
  double slowest = 0, sum = 0;
  for (const SimResult& sim : best.sims) {
    slowest = std::max(slowest, sim.makespan_ms);
    sum += sim.makespan_ms;
  }
  best.dp_imbalance = sum > 0 ? slowest * D / sum : 1;
  return absl::OkStatus();
}

void Planner::BuildPlans(std::span<const Sample> samples, int64_t iteration, IterationPlan& best) const {
  const int D = config_.dp, S = config_.pp;
  const bool ed = model_->encoder_decoder();
  best.plans.reserve(static_cast<size_t>(S) * D);
  int64_t loss_tokens = 0;
  for (const Sample& s : samples) loss_tokens += LossTokens(s, ed);
  for (int g = 0; g < D; ++g) {
    GroupPlanInput in;
    in.model = model_.get();
    in.samples = samples;
    in.mbs = best.groups[g];
    in.sim = &best.sims[g];
    in.dp_rank = g;
    in.dp_size = D;
    in.job_id = config_.job_id;
    in.iteration = iteration;
    in.schedule = best.schedules[g];
    in.recompute = best.recompute;
    in.predicted_iteration_ms = best.predicted_ms;
    in.global_loss_tokens = loss_tokens;
    for (auto& p : BuildGroupPlans(in)) best.plans.push_back(std::move(p));
  }
}

absl::StatusOr<IterationPlan> Planner::Plan(std::span<const Sample> samples, int64_t iteration, Batching batching,
                                            const PlanRequest& request) const {
  const auto t_start = std::chrono::steady_clock::now();
  if (samples.empty()) return absl::InvalidArgumentError(absl::StrCat("iteration ", iteration, ": no samples"));
  const int D = config_.dp;
  if (static_cast<int>(samples.size()) < D) {
    return absl::InvalidArgumentError(absl::StrCat("iteration ", iteration, ": ", samples.size(),
                                                   " samples for ", D, " data-parallel groups"));
  }
  const uint64_t seed = config_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(iteration);
  Search s;
  s.batching = batching;
  s.options = SearchOptionsOf(config_, seed);
  s.best.predicted_ms = std::numeric_limits<double>::infinity();
  s.keep_split = batching == Batching::kDynamic && config_.parts.rebalance && D > 1;
  for (Recompute r : LevelsOf(config_.recompute)) {
    // Dominance prune: more recomputation only adds backward work and saves
    // memory. Once a level's split was not limited by memory and none of its
    // simulated schedules exceeded memory, deeper levels cannot be faster.
    // Splits and orders skipped on their bounds are not simulated and count
    // no rejection: at a deeper level they cost more and still cannot win,
    // though a deeper level's own splits (the DP's and the ramped runs
    // depend on it) are then not tried. Plans were the same as without the
    // skipping on 48 memory-limited set-ups, 19 of them recomputing.
    if (SearchLevel(samples, seed, r, s)) break;
  }
  if (s.best_groups.empty()) {
    return s.last_error.ok() ? absl::FailedPreconditionError("no feasible plan") : s.last_error;
  }
  if (s.keep_split) {
    const auto t0 = std::chrono::steady_clock::now();
    Rebalance(s);
    s.schedule_ms += MsSince(t0);
  }
  IterationPlan& best = s.best;
  best.iteration = iteration;
  best.batching = batching;
  best.simulations = s.simulations;
  best.candidates = s.candidates;
  best.candidates_pruned = s.pruned;
  const bool ed = model_->encoder_decoder();
  for (const Sample& smp : samples) best.tokens += smp.input + (ed ? smp.target : 0);
  std::vector<MicroBatch> all;
  for (const auto& g : best.groups) all.insert(all.end(), g.begin(), g.end());
  best.padding_efficiency = PaddingEfficiency(samples, all, ed);

  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(Resimulate(s, request.record || request.build_plans, best));
  if (request.build_plans) BuildPlans(samples, iteration, best);
  best.timings.instructions_ms = MsSince(t0);
  if (request.build_plans && request.validate) RETURN_IF_ERROR(ValidateGenerated(samples, best));
  if (!request.record) best.sims.clear();
  best.timings.partition_ms = s.partition_ms;
  best.timings.schedule_ms = s.schedule_ms;
  best.timings.total_ms = MsSince(t_start);
  return std::move(best);
}

}  // namespace dynapipe::planner
