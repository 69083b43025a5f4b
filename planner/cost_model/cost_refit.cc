#include "planner/cost_model/cost_refit.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "planner/cost_model/nnls.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner {
namespace {

// The pipeline factor corrects what per-instruction times miss; more than
// this either way means the fit itself is wrong.
constexpr double kMinPipelineFactor = 0.5, kMaxPipelineFactor = 2.0;
// Bisection steps for the per-pass hand-off cost (to 2^-30 of a pipeline).
constexpr int kHandoffSteps = 30;
// Exploration's cost per micro-batch, at least this share of a chunk pass.
constexpr double kExploreMbShare = 0.3;
// Exploration toward smaller micro-batches: the size term's share of a
// typical pass at least this.
constexpr double kExploreSizeShare = 0.3;
// With a measured shape, the pull toward the previous fit's scale and cost
// per micro-batch (scaled problem: a direction the window's passes tell
// apart this weakly moves half way).
constexpr double kLevelRidge = 1e-1;

Recompute RecomputeOf(proto::RecomputeLevel::Value v) {
  switch (v) {
    case proto::RecomputeLevel::selective: return Recompute::kSelective;
    case proto::RecomputeLevel::full: return Recompute::kFull;
    default: return Recompute::kNone;
  }
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Megabytes(const proto::CommOp& op) {
  double bytes = 0;
  for (const proto::TensorShape& s : op.shapes()) {
    double n = 1;
    for (int64_t d : s.dims()) n *= static_cast<double>(d);
    bytes += n * (s.dtype() == proto::DType::fp32 ? 4 : 2);
  }
  return bytes / 1e6;
}

// A planned micro-batch's shape as executors compute it (WorkShape).
Shape ShapeOf(const proto::MicroBatch& mb, const WorkModel& work) {
  int64_t sum_sq = 0, scored = 0;
  const bool ed = mb.dec_seq_len() > 0;
  for (const proto::PlacedSample& s : mb.samples()) {
    const int64_t len = std::clamp<int64_t>(s.input_len(), 0, mb.seq_len());
    sum_sq += len * len;
    scored += ScoredRows(len, ed ? std::min<int64_t>(s.target_len(), mb.dec_seq_len()) : s.target_len(), ed);
  }
  Shape shape = WorkShape({mb.rows(), mb.seq_len(), mb.dec_seq_len()}, sum_sq, work);
  shape.scored = std::max<int64_t>(scored, 1);
  return shape;
}

// A chunk's base costs and features for one micro-batch shape.
struct ChunkSample {
  double base_fw = 0, base_bw = 0, tokens = 0, attention = 0, size = 0;
};

absl::StatusOr<ChunkSample> ChunkSampleOf(const Chunk& c, const LayerCostModel& base, const Shape& shape,
                                          Recompute r) {
  ChunkSample out;
  for (const auto& [kind, n] : LayerCounts(c)) {
    if (n == 0) continue;
    absl::StatusOr<LayerCost> l = base.Cost(kind, shape, r);
    if (!l.ok()) return l.status();
    const LayerFeatures f = FeaturesOf(kind, shape);
    out.base_fw += n * l->fw_ms;
    out.base_bw += n * l->bw_ms;
    out.tokens += n * f.tokens;
    out.attention += n * f.attention;
    out.size += n * f.size;
  }
  return out;
}

// An iteration's pipeline, the time after it left out: simulated under
// `terms` (its factor and per-micro-batch term as given) and measured.
// False where either is not positive.
bool PipelineSpans(const RefitTerms& terms, const IterationSamples& s, double* simulated, double* measured) {
  const double after = std::max(0.0, terms.iteration_ms);
  *simulated = CostRefit::PredictIteration(terms, s) - after;
  *measured = s.measured_ms - after;
  return *simulated > 0 && *measured > 0;
}

double PassTime(const PassFit& p, const ComputeSample& s) {
  return p.scale * s.base_ms + p.token_ms * s.tokens + p.attention_ms * s.attention + p.size_ms * s.size +
         p.micro_batch_ms;
}

// One pass's terms over the window. With `shape` every term; without, the
// base model's shape is kept (a measured profile's): only its scale and the
// cost per micro-batch are fitted, and once `fitted`, what the window cannot
// tell apart (passes of one size: a scale from a cost per micro-batch)
// stays where the previous fit (`prior`) put it.
PassFit FitPass(std::span<const IterationSamples* const> window, bool backward, const PassFit& prior,
                double ridge, bool shape, bool fitted) {
  // Columns: base, tokens, attention, per micro-batch, size; without
  // `shape` base and per micro-batch.
  NnlsProblem p;
  p.num_features = shape ? 5 : 2;
  double measured = 0, base = 0;
  for (const IterationSamples* it : window) {
    for (const ComputeSample& s : it->compute) {
      if (s.backward != backward) continue;
      const double full[5] = {s.base_ms, s.tokens, s.attention, 1.0, s.size};
      const double level[2] = {s.base_ms, 1.0};
      p.AddRow(shape ? std::span<const double>(full) : std::span<const double>(level), s.measured_ms);
      measured += s.measured_ms;
      base += s.base_ms;
    }
  }
  if (p.rows() == 0) return prior;
  const double scale = base > 0 ? measured / base : 1.0;
  if (!shape) {
    const double prior_w[2] = {fitted ? prior.scale : scale, fitted ? prior.micro_batch_ms : 0};
    const std::vector<double> w = SolveNnls(p, prior_w, fitted ? std::max(ridge, kLevelRidge) : ridge);
    return {.scale = w[0], .micro_batch_ms = w[1]};
  }
  // What the data cannot tell apart keeps the base model's shape, scaled to
  // the measured total. The size term is pulled toward what earlier fits
  // learned, as a tie-breaker only: once plans settle on one size, the
  // window no longer shows how a token's cost grows with it, and the term
  // falls to about 0 (a measured shape is kept whole instead, above).
  const double prior_w[5] = {scale, 0, 0, 0, prior.size_ms};
  const std::vector<double> w = SolveNnls(p, prior_w, ridge);
  return {w[0], w[1], w[2], w[3], w[4]};
}

// Fills out->groups (and the layout) from the plans: each group's
// micro-batches with every chunk's features, and each device's op order.
absl::Status AddReplay(const PipelineModel& layout, const LayerCostModel& base,
                       std::span<const proto::ExecutionPlan> plans, IterationSamples* out) {
  const int S = layout.num_devices(), C = layout.num_chunks();
  const int D = static_cast<int>(plans.size()) / S;
  if (D * S != static_cast<int>(plans.size())) {
    return absl::InvalidArgumentError(absl::StrCat("refit: ", plans.size(), " plans for ", S, " pipeline stages"));
  }
  out->num_devices = S;
  out->chunk_device.clear();
  for (const Chunk& c : layout.chunks()) out->chunk_device.push_back(c.device);
  std::vector<std::vector<int>> chunk_of(S);
  for (int c = 0; c < C; ++c) chunk_of[layout.chunks()[c].device].push_back(c);
  out->groups.assign(D, {});
  for (const proto::ExecutionPlan& plan : plans) {
    if (plan.dp_rank() < 0 || plan.dp_rank() >= D || plan.pp_rank() < 0 || plan.pp_rank() >= S) {
      return absl::InvalidArgumentError(absl::StrCat("refit: plan of rank ", plan.rank(), " is outside ", S, " x ", D));
    }
    ReplayGroup& g = out->groups[plan.dp_rank()];
    if (g.orders.empty()) {
      g.orders.assign(S, {});
      g.num_mb = plan.micro_batches_size();
      g.fw.resize(static_cast<size_t>(g.num_mb) * C);
      g.bw.resize(g.fw.size());
      g.boundary_mb.resize(g.fw.size());
      const Recompute r = RecomputeOf(plan.recompute());
      for (int m = 0; m < g.num_mb; ++m) {
        const proto::MicroBatch& mb = plan.micro_batches(m);
        const Shape shape = ShapeOf(mb, layout.work());
        for (int c = 0; c < C; ++c) {
          absl::StatusOr<ChunkSample> cs = ChunkSampleOf(layout.chunks()[c], base, shape, r);
          if (!cs.ok()) return cs.status();
          const size_t i = static_cast<size_t>(m) * C + c;
          g.fw[i] = {false, cs->base_fw, cs->tokens, cs->attention, cs->size, 0};
          g.bw[i] = {true, cs->base_bw, cs->tokens, cs->attention, cs->size, 0};
          g.boundary_mb[i] = layout.BoundaryMb(shape, c);
        }
      }
    } else if (plan.micro_batches_size() != g.num_mb) {
      return absl::InvalidArgumentError(absl::StrCat("refit: ranks of data-parallel group ", plan.dp_rank(),
                                                     " disagree on its micro-batches"));
    }
    std::vector<SimOp>& order = g.orders[plan.pp_rank()];
    const auto& local = chunk_of[plan.pp_rank()];
    for (const proto::Instruction& ins : plan.instructions()) {
      if (!ins.has_forward() && !ins.has_backward()) continue;
      if (ins.chunk() < 0 || ins.chunk() >= static_cast<int>(local.size())) {
        return absl::InvalidArgumentError(absl::StrCat("refit: rank ", plan.rank(), " names chunk ", ins.chunk()));
      }
      order.push_back({ins.has_forward() ? SimOp::kForward : SimOp::kBackward, ins.micro_batch(), local[ins.chunk()]});
    }
  }
  return absl::OkStatus();
}

// The forward and backward pass terms fitted over `its` (FitPass); the rest
// is `prior`.
RefitTerms FitCompute(std::span<const IterationSamples* const> its, const RefitTerms& prior, double ridge,
                      bool shape, bool fitted) {
  RefitTerms t = prior;
  t.fw = FitPass(its, false, prior.fw, ridge, shape, fitted);
  t.bw = FitPass(its, true, prior.bw, ridge, shape, fitted);
  return t;
}

// The iterations whose speed under `fit` (measured over predicted compute)
// is within `outlier` of the window's median.
std::vector<const IterationSamples*> WithoutOutliers(const std::vector<const IterationSamples*>& all,
                                                     const RefitTerms& fit, double outlier) {
  std::vector<double> speed;
  for (const IterationSamples* s : all) {
    double measured = 0;
    for (const ComputeSample& c : s->compute) measured += c.measured_ms;
    const double predicted = CostRefit::PredictCompute({fit.fw, fit.bw}, *s);
    speed.push_back(predicted > 0 ? measured / predicted : 1.0);
  }
  const double median_speed = Median(speed);
  std::vector<const IterationSamples*> kept;
  for (size_t i = 0; i < all.size(); ++i) {
    if (std::abs(speed[i] / median_speed - 1) <= outlier) kept.push_back(all[i]);
  }
  return kept;
}

// Medians for dispatch and the time after the pipeline; the transfer terms
// by least squares.
void FitScalarTerms(std::span<const IterationSamples* const> kept, const RefitTerms& prior, double ridge,
                    RefitTerms& fit) {
  std::vector<double> dispatch_fw, dispatch_bw, after;
  NnlsProblem transfers;
  transfers.num_features = 2;
  for (const IterationSamples* s : kept) {
    if (s->units > 0) {
      dispatch_fw.push_back(s->dispatch_fw_ms / s->units);
      dispatch_bw.push_back(s->dispatch_bw_ms / s->units);
    }
    after.push_back(s->iteration_ms);
    for (const TransferSample& x : s->transfers) {
      const double row[2] = {1.0, x.mb};
      transfers.AddRow(row, x.measured_ms);
    }
  }
  fit.dispatch_fw_ms = Median(dispatch_fw);
  fit.dispatch_bw_ms = Median(dispatch_bw);
  fit.iteration_ms = Median(after);
  if (transfers.rows() > 0) {
    const double prior_x[2] = {std::max(0.0, prior.transfer_latency_ms), std::max(0.0, prior.transfer_ms_per_mb)};
    const std::vector<double> w = SolveNnls(transfers, prior_x, ridge);
    fit.transfer_latency_ms = w[0];
    fit.transfer_ms_per_mb = w[1];
  }
}

// Bounded step: once fitted, the window's predicted compute and dispatch
// move by at most max_step from the previous fit. The first fit replaces the
// base model outright: it is off by whatever it is off.
void BoundStep(std::span<const IterationSamples* const> kept, const RefitTerms& prior, bool fitted,
               double max_step, RefitTerms& fit) {
  double before = 0, now = 0;
  for (const IterationSamples* s : kept) {
    before += CostRefit::PredictCompute(prior, *s);
    now += CostRefit::PredictCompute(fit, *s);
  }
  double t = 1;
  if (!fitted) before = 0;
  if (before > 0 && now > before * max_step) t = (before * max_step - before) / (now - before);
  if (before > 0 && now < before / max_step) t = (before / max_step - before) / (now - before);
  if (t < 1) {
    auto mix = [t](double a, double b) { return a + t * (b - a); };
    auto mix_pass = [&](const PassFit& a, const PassFit& b) {
      return PassFit{mix(a.scale, b.scale), mix(a.token_ms, b.token_ms), mix(a.attention_ms, b.attention_ms),
                     mix(a.micro_batch_ms, b.micro_batch_ms), mix(a.size_ms, b.size_ms)};
    };
    fit.fw = mix_pass(prior.fw, fit.fw);
    fit.bw = mix_pass(prior.bw, fit.bw);
    fit.dispatch_fw_ms = mix(prior.dispatch_fw_ms, fit.dispatch_fw_ms);
    fit.dispatch_bw_ms = mix(prior.dispatch_bw_ms, fit.dispatch_bw_ms);
  }
}

// The slowest group's pipeline of `s` replayed: each pass `pass_ms(pass)`
// (a ComputeSample of the group's fw or bw), transfers under `terms`. -1 if
// it cannot be simulated (no replay).
double ReplayMs(const RefitTerms& terms, const IterationSamples& s,
                const std::function<double(const ComputeSample&)>& pass_ms) {
  if (s.groups.empty()) return -1;
  const int C = static_cast<int>(s.chunk_device.size());
  const bool transfers = terms.transfer_latency_ms >= 0 && terms.transfer_ms_per_mb >= 0;
  double slowest = 0;
  for (const ReplayGroup& g : s.groups) {
    PipelineTimes t;
    t.Resize(s.num_devices, C, g.num_mb);
    t.chunk_device = s.chunk_device;
    for (size_t i = 0; i < g.fw.size(); ++i) {
      t.fw_ms[i] = pass_ms(g.fw[i]);
      t.bw_ms[i] = pass_ms(g.bw[i]);
      if (transfers) {
        t.comm_fw_ms[i] = t.comm_bw_ms[i] = terms.transfer_latency_ms + g.boundary_mb[i] * terms.transfer_ms_per_mb;
      }
    }
    absl::StatusOr<SimResult> sim = Simulate(t, g.orders, /*record=*/false);
    if (!sim.ok()) return -1;
    slowest = std::max(slowest, sim->makespan_ms);
  }
  return slowest;
}

// The pipeline replayed with every pass and the dispatch as measured and
// `extra_ms` added to each forward and backward.
double MeasuredReplayMs(const RefitTerms& terms, const IterationSamples& s, double extra_ms) {
  const double dispatch_fw = s.units > 0 ? s.dispatch_fw_ms / s.units : 0;
  const double dispatch_bw = s.units > 0 ? s.dispatch_bw_ms / s.units : 0;
  return ReplayMs(terms, s, [&](const ComputeSample& c) {
    return c.measured_ms + (c.backward ? dispatch_bw : dispatch_fw) + extra_ms;
  });
}

// What each micro-batch costs `s` beyond its instructions (hand-offs between
// ranks that wait on each other, threads that share cores), as a cost per
// forward and backward: the one that, added to every pass of a replay with
// the passes and dispatch as measured (MeasuredReplayMs), makes the replay
// last as long as the iteration's measured pipeline. Measured passes leave
// only what no instruction shows to this term, so one iteration tells it,
// whatever its micro-batch count. 0 where the replay alone lasts as long;
// -1 where the iteration has no replay or a pass was not timed.
double HandoffPerPassMs(const RefitTerms& terms, const IterationSamples& s) {
  for (const ReplayGroup& g : s.groups) {
    for (size_t i = 0; i < g.fw.size(); ++i) {
      if (g.fw[i].measured_ms <= 0 || g.bw[i].measured_ms <= 0) return -1;
    }
  }
  const double span = s.measured_ms - s.iteration_ms;
  const double bare = MeasuredReplayMs(terms, s, 0);
  if (bare < 0 || span <= 0) return -1;
  if (bare >= span) return 0;
  // With `span` added to every pass the replay, a pass at least, lasts
  // longer than the pipeline did.
  double lo = 0, hi = span;
  for (int i = 0; i < kHandoffSteps; ++i) {
    const double mid = (lo + hi) / 2;
    (MeasuredReplayMs(terms, s, mid) < span ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// The pipeline factor k: the median of measured over simulated, bounded by
// max_step from the previous fit once fitted.
void FitPipelineFactor(std::span<const IterationSamples* const> kept, const RefitTerms& prior, bool fitted,
                       double max_step, RefitTerms& fit) {
  std::vector<double> ratios;
  for (const IterationSamples* s : kept) {
    double simulated = 0, measured = 0;
    if (PipelineSpans(fit, *s, &simulated, &measured)) ratios.push_back(measured / simulated);
  }
  if (ratios.empty()) return;
  fit.pipeline_factor = Median(ratios);
  if (fitted) {
    fit.pipeline_factor = std::clamp(fit.pipeline_factor, prior.pipeline_factor / max_step,
                                     prior.pipeline_factor * max_step);
  }
  fit.pipeline_factor = std::clamp(fit.pipeline_factor, kMinPipelineFactor, kMaxPipelineFactor);
}

// Reads one rank's report against its plan into samples: compute passes
// with their chunk's base costs, dispatch, sends and the time after the
// pipeline.
class ReportReader {
 public:
  ReportReader(const PipelineModel& layout, const LayerCostModel& base, const proto::ExecutionPlan& plan,
               const std::vector<int>& local, int rank, IterationSamples* out)
      : layout_(layout), base_(base), plan_(plan), local_(local), rank_(rank), r_(RecomputeOf(plan.recompute())),
        out_(*out) {}

  absl::Status AddTiming(const proto::InstructionTiming& t);
  // The rank's sends, and its time after the pipeline (the report's end
  // past its last instruction included).
  double Finish(const proto::IterationReport& report) {
    for (const auto& [key, s] : sends_) out_.transfers.push_back(s);
    return after_pipeline_ + std::max(0.0, report.iteration_ms() - last_end_);
  }

 private:
  absl::Status AddCompute(const proto::InstructionTiming& t, const proto::Instruction& ins, double ms);

  const PipelineModel& layout_;
  const LayerCostModel& base_;
  const proto::ExecutionPlan& plan_;
  const std::vector<int>& local_;  // local chunk -> chunk
  const int rank_;
  const Recompute r_;
  IterationSamples& out_;
  std::map<std::pair<int, int>, ChunkSample> cache_;  // (micro-batch, chunk)
  std::map<std::pair<int, bool>, TransferSample> sends_;  // (micro-batch, activation)
  double last_end_ = 0, after_pipeline_ = 0;
};

absl::Status ReportReader::AddTiming(const proto::InstructionTiming& t) {
  if (t.index() < 0 || t.index() >= plan_.instructions_size()) {
    return absl::InvalidArgumentError(absl::StrCat("refit: rank ", rank_, " timed instruction ", t.index(),
                                                   " of a plan with ", plan_.instructions_size()));
  }
  const proto::Instruction& ins = plan_.instructions(t.index());
  const double ms = std::max(0.0, t.end_ms() - t.start_ms());
  last_end_ = std::max(last_end_, t.end_ms());
  switch (ins.op_case()) {
    case proto::Instruction::kForward:
    case proto::Instruction::kBackward: return AddCompute(t, ins, ms);
    case proto::Instruction::kLoadInput:
    case proto::Instruction::kRecvActivationStart: out_.dispatch_fw_ms += ms; break;
    case proto::Instruction::kRecvGradStart:
    case proto::Instruction::kFreeBuffer: out_.dispatch_bw_ms += ms; break;
    case proto::Instruction::kSendActivationStart:
    case proto::Instruction::kSendGradStart: {
      const bool act = ins.op_case() == proto::Instruction::kSendActivationStart;
      TransferSample& s = sends_[{ins.micro_batch(), act}];
      s.mb += Megabytes(act ? ins.send_activation_start() : ins.send_grad_start());
      s.measured_ms += ms;
      break;
    }
    case proto::Instruction::kSendActivationFinish:
    case proto::Instruction::kSendGradFinish:
      sends_[{ins.micro_batch(), ins.op_case() == proto::Instruction::kSendActivationFinish}].measured_ms += ms;
      break;
    case proto::Instruction::kAllReduceGrads:
    case proto::Instruction::kOptimizerStep: after_pipeline_ += ms; break;
    default: break;  // receive finishes wait for peers: the simulation models that
  }
  return absl::OkStatus();
}

absl::Status ReportReader::AddCompute(const proto::InstructionTiming& t, const proto::Instruction& ins, double ms) {
  if (ins.chunk() < 0 || ins.chunk() >= static_cast<int>(local_.size()) || ins.micro_batch() < 0 ||
      ins.micro_batch() >= plan_.micro_batches_size()) {
    return absl::InvalidArgumentError(absl::StrCat("refit: rank ", rank_, " instruction ", t.index(),
                                                   " names chunk ", ins.chunk(), " micro-batch ",
                                                   ins.micro_batch()));
  }
  const int chunk = local_[ins.chunk()];
  auto it = cache_.find({ins.micro_batch(), chunk});
  if (it == cache_.end()) {
    const proto::MicroBatch& mb = plan_.micro_batches(ins.micro_batch());
    absl::StatusOr<ChunkSample> cs = ChunkSampleOf(layout_.chunks()[chunk], base_, ShapeOf(mb, layout_.work()), r_);
    if (!cs.ok()) return cs.status();
    it = cache_.emplace(std::make_pair(ins.micro_batch(), chunk), *cs).first;
  }
  const bool backward = ins.op_case() == proto::Instruction::kBackward;
  const ChunkSample& cs = it->second;
  out_.compute.push_back({backward, backward ? cs.base_bw : cs.base_fw, cs.tokens, cs.attention, cs.size, ms});
  ReplayGroup& g = out_.groups[plan_.dp_rank()];  // AddReplay made it, its micro-batches this plan's
  (backward ? g.bw : g.fw)[static_cast<size_t>(ins.micro_batch()) * layout_.num_chunks() + chunk].measured_ms += ms;
  if (!backward) ++out_.units;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IterationSamples> SamplesOf(const PipelineModel& layout, const LayerCostModel& base,
                                           std::span<const proto::ExecutionPlan> plans,
                                           std::span<const proto::IterationReport> reports) {
  if (plans.empty() || reports.size() != plans.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("refit: ", plans.size(), " plans and ", reports.size(), " reports for one iteration"));
  }
  IterationSamples out;
  out.iteration = plans[0].iteration();
  out.predicted_ms = plans[0].predicted_iteration_ms();
  RETURN_IF_ERROR(AddReplay(layout, base, plans, &out));  // the groups the reports' passes are timed into
  std::vector<std::vector<int>> chunk_of(layout.num_devices());  // [device][local chunk] -> chunk
  for (int c = 0; c < layout.num_chunks(); ++c) chunk_of[layout.chunks()[c].device].push_back(c);
  bool first_report = true;
  for (const proto::IterationReport& report : reports) {
    const int rank = report.rank();
    if (rank < 0 || rank >= static_cast<int>(plans.size()) || plans[rank].iteration() != report.iteration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("refit: report of rank ", rank, " iteration ", report.iteration(), " has no plan"));
    }
    const proto::ExecutionPlan& plan = plans[rank];
    const int device = plan.pp_rank();
    if (device < 0 || device >= layout.num_devices()) {
      return absl::InvalidArgumentError(absl::StrCat("refit: plan of rank ", rank, " has pp_rank ", device));
    }
    ReportReader reader(layout, base, plan, chunk_of[device], rank, &out);
    out.measured_ms = std::max(out.measured_ms, report.iteration_ms());
    for (const proto::InstructionTiming& t : report.timings()) RETURN_IF_ERROR(reader.AddTiming(t));
    const double after_pipeline = reader.Finish(report);
    out.iteration_ms = first_report ? after_pipeline : std::min(out.iteration_ms, after_pipeline);
    first_report = false;
  }
  return out;
}

CostRefit::CostRefit(std::shared_ptr<const LayerCostModel> base, RefitOptions options)
    : base_(std::move(base)), options_(options), model_(base_) {
  options_.window = std::max(1, options_.window);
  options_.min_iterations = std::clamp(options_.min_iterations, 1, options_.window);
  options_.max_step = std::max(1.0, options_.max_step);
}

RefitTerms CostRefit::ExplorationTerms(bool smaller) const {
  RefitTerms t = terms_;
  if (smaller) {
    // At the window's typical size the size term adds kExploreSizeShare of a
    // pass; it grows with the square of the size, so smaller ones win.
    t.fw.size_ms = std::max(2 * t.fw.size_ms, kExploreSizeShare * pass_per_size_);
    t.bw.size_ms = std::max(2 * t.bw.size_ms, kExploreSizeShare * pass_per_size_);
    return t;
  }
  t.pipeline_mb_ms = std::max(2 * t.pipeline_mb_ms, kExploreMbShare * chunk_ms_);
  return t;
}

void CostRefit::Add(IterationSamples samples) {
  window_.push_back(std::move(samples));
  while (static_cast<int>(window_.size()) > options_.window) window_.pop_front();
  if (static_cast<int>(window_.size()) >= options_.min_iterations) Refit();
}

double CostRefit::PredictCompute(const RefitTerms& terms, const IterationSamples& s) {
  double total = 0;
  for (const ComputeSample& c : s.compute) total += PassTime(c.backward ? terms.bw : terms.fw, c);
  return total + (terms.dispatch_fw_ms + terms.dispatch_bw_ms) * s.units;
}

double CostRefit::PredictIteration(const RefitTerms& terms, const IterationSamples& s) {
  const double k = terms.pipeline_factor;
  const double pipeline = ReplayMs(terms, s, [&](const ComputeSample& c) {
    const double dispatch = c.backward ? terms.dispatch_bw_ms : terms.dispatch_fw_ms;
    return k * (PassTime(c.backward ? terms.bw : terms.fw, c) + dispatch + terms.pipeline_mb_ms);
  });
  return pipeline < 0 ? -1 : pipeline + std::max(0.0, terms.iteration_ms);
}

void CostRefit::Refit() {
  std::vector<const IterationSamples*> all;
  for (const IterationSamples& s : window_) all.push_back(&s);
  const RefitTerms prior = terms_;
  const bool shape = !base_->MeasuredShape();
  RefitTerms fit = FitCompute(all, prior, options_.ridge, shape, fitted_);
  std::vector<const IterationSamples*> kept = WithoutOutliers(all, fit, options_.outlier);
  outliers_ = static_cast<int>(all.size() - kept.size());
  if (kept.size() < all.size() && !kept.empty()) fit = FitCompute(kept, prior, options_.ridge, shape, fitted_);
  if (kept.empty()) kept = all;
  FitScalarTerms(kept, prior, options_.ridge, fit);
  BoundStep(kept, prior, fitted_, options_.max_step, fit);

  // Pipeline terms. b, what each micro-batch costs an iteration beyond its
  // instructions (hand-offs between ranks that wait on each other), is a
  // cost on every forward and backward: the median over the window of what
  // each iteration's replay with its passes as measured leaves unexplained
  // (HandoffPerPassMs). k is then the median of measured over simulated
  // (each pipeline replayed under the new costs, b included) over the window.
  std::vector<double> passes, per_size;
  for (const IterationSamples* s : kept) {
    for (const ComputeSample& c : s->compute) {
      passes.push_back(PassTime(c.backward ? fit.bw : fit.fw, c));
      if (c.size > 0) per_size.push_back(passes.back() / c.size);
    }
  }
  chunk_ms_ = Median(passes);
  pass_per_size_ = Median(per_size);
  fit.pipeline_factor = 1;
  std::vector<double> handoffs;
  for (const IterationSamples* s : kept) {
    if (const double h = HandoffPerPassMs(fit, *s); h >= 0) handoffs.push_back(h);
  }
  fit.pipeline_mb_ms = handoffs.empty() ? prior.pipeline_mb_ms : Median(handoffs);
  FitPipelineFactor(kept, prior, fitted_, options_.max_step, fit);
  terms_ = fit;
  fitted_ = true;
  ++refits_;
  model_ = std::make_shared<RefitCostModel>(base_, terms_);
}

}  // namespace dynapipe::planner
