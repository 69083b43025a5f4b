#include "planner/partition/batching.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace dynapipe::planner {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// Tokens a sample occupies in one row: decoder-only models see input + target
// as one sequence (Sample::input already holds it); encoder-decoder models
// have separate encoder and decoder rows.
int EncLen(const Sample& s) { return s.input; }
int DecLen(const Sample& s, bool encoder_decoder) { return encoder_decoder ? s.target : 0; }

}  // namespace

const char* BatchingName(Batching b) {
  switch (b) {
    case Batching::kDynamic: return "dynamic";
    case Batching::kPacking: return "packing";
    case Batching::kPadding: return "padding";
    case Batching::kTokenBased: return "token_based";
    case Batching::kFixedMbs: return "fixed_mbs";
    case Batching::kPackingBalanced: return "packing_balanced";
    case Batching::kWlb: return "wlb";
  }
  return "?";
}

std::vector<int> OrderSamples(std::span<const Sample> samples, bool encoder_decoder, uint64_t seed) {
  const int n = static_cast<int>(samples.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int i) { return Mix(seed ^ static_cast<uint64_t>(samples[i].id)); };
  if (!encoder_decoder) {
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if (samples[a].input != samples[b].input) return samples[a].input < samples[b].input;
      return key(a) < key(b);
    });
    return order;
  }
  // Nearest-neighbour tour in (input, target) space, L1 distance, from the
  // shortest sample. Sorting first makes the scan start near the answer.
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const int la = samples[a].input + samples[a].target, lb = samples[b].input + samples[b].target;
    return la != lb ? la < lb : key(a) < key(b);
  });
  std::vector<int> tour;
  tour.reserve(n);
  std::vector<char> used(n, 0);
  int cur = order[0];
  used[0] = 1;
  tour.push_back(cur);
  std::vector<int> pos_of(n);
  for (int p = 0; p < n; ++p) pos_of[order[p]] = p;
  for (int step = 1; step < n; ++step) {
    int best = -1;
    long best_d = 0;
    uint64_t best_k = 0;
    for (int p = 0; p < n; ++p) {
      if (used[p]) continue;
      const int i = order[p];
      const long d = std::labs(static_cast<long>(samples[i].input) - samples[cur].input) +
                     std::labs(static_cast<long>(samples[i].target) - samples[cur].target);
      if (best < 0 || d < best_d || (d == best_d && key(i) < best_k)) {
        best = p;
        best_d = d;
        best_k = key(i);
      }
    }
    used[best] = 1;
    cur = order[best];
    tour.push_back(cur);
  }
  return tour;
}

Shape PaddedShape(std::span<const Sample> samples, std::span<const int> order, int round_multiple,
                  bool encoder_decoder) {
  int enc = 0, dec = 0;
  for (int i : order) {
    enc = std::max(enc, EncLen(samples[i]));
    dec = std::max(dec, DecLen(samples[i], encoder_decoder));
  }
  return Shape{static_cast<int>(order.size()), RoundUp(enc, round_multiple),
               dec > 0 ? RoundUp(dec, round_multiple) : 0};
}

std::vector<MicroBatch> FromSplit(std::span<const Sample> samples, std::span<const int> order,
                                  std::span<const int> ends, int round_multiple, bool encoder_decoder) {
  std::vector<MicroBatch> out;
  out.reserve(ends.size());
  int begin = 0;
  for (int end : ends) {
    MicroBatch mb;
    mb.shape = PaddedShape(samples, order.subspan(begin, end - begin), round_multiple, encoder_decoder);
    mb.samples.reserve(end - begin);
    for (int i = begin; i < end; ++i) mb.samples.push_back({order[i], i - begin, 0});
    out.push_back(std::move(mb));
    begin = end;
  }
  return out;
}

void ApplyWork(std::span<const Sample> samples, const WorkModel& work, std::span<MicroBatch> mbs) {
  for (MicroBatch& mb : mbs) {
    const bool ed = mb.shape.dec_seq > 0;
    int64_t sum_sq = 0, scored = 0;
    for (const Placement& p : mb.samples) {
      const Sample& s = samples[p.sample];
      const int64_t len = std::min(EncLen(s), mb.shape.seq);  // packing truncates to the row
      sum_sq += len * len;
      scored += std::min(LossTokens(s, ed), static_cast<int64_t>(ed ? mb.shape.dec_seq : mb.shape.seq));
    }
    mb.shape = WorkShape(mb.shape, sum_sq, work);
    mb.shape.scored = std::max<int64_t>(scored, 1);  // the head on the rows it scores
  }
}

namespace {

// Upper bound on the objective from a simple split (about 2 micro-batches
// per stage, equal tokens). A micro-batch whose bubble term alone exceeds it
// cannot be part of an optimal split, so rows stop there; this keeps the
// table small where memory would allow huge micro-batches of short samples.
double ObjectiveBound(std::span<const Sample> samples, std::span<const int> order, ShapeCosts& costs, Recompute r,
                      const DpOptions& dp, const DynamicOptions& options) {
  const bool ed = costs.model().encoder_decoder();
  int64_t total = 0;
  for (int i : order) total += EncLen(samples[i]) + DecLen(samples[i], ed);
  const int64_t budget = std::max<int64_t>(1, total / std::max(1, 2 * dp.stages));
  auto simple = TokenBasedBatches(samples, order, budget, options.round_multiple, ed);
  ApplyWork(samples, costs.model().work(), std::span<MicroBatch>(simple));
  double mx = 0, sum = 0;
  for (const MicroBatch& mb : simple) {
    auto c = costs.Time(mb.shape, r);
    if (!c.ok() || !c->fits[0]) return std::numeric_limits<double>::infinity();
    mx = std::max(mx, c->time_ms);
    sum += c->time_ms;
  }
  if (dp.stages <= 1) return std::numeric_limits<double>::infinity();
  return PipelineObjective(mx, sum, dp) * dp.chunks_per_device / (dp.stages - 1);
}

// Fills the DP's cost table for `order` under one memory budget (preferred
// or "one micro-batch must fit").
class TableFiller {
 public:
  TableFiller(std::span<const Sample> samples, std::span<const int> order, ShapeCosts& costs, Recompute r,
              const DynamicOptions& options, double bound_ms)
      : samples_(samples), order_(order), costs_(costs), r_(r), options_(options), bound_ms_(bound_ms),
        ed_(costs.model().encoder_decoder()), n_(static_cast<int>(order.size())),
        kcap_(options.max_mbs > 0 ? options.max_mbs : n_) {}

  // False when some sample fits in no micro-batch under the preferred budget;
  // FAILED_PRECONDITION when it does not under the fallback one.
  absl::StatusOr<bool> Fill(CostTable& table, bool preferred, bool* memory_bound) const;

 private:
  // Row j: micro-batches ending at j, growing until one fails or loses.
  absl::Status FillRow(CostTable& table, int j, bool preferred, bool* memory_bound) const;

  const std::span<const Sample> samples_;
  const std::span<const int> order_;
  ShapeCosts& costs_;
  const Recompute r_;
  const DynamicOptions& options_;
  const double bound_ms_;
  const bool ed_;
  const int n_, kcap_;
};

absl::StatusOr<bool> TableFiller::Fill(CostTable& table, bool preferred, bool* memory_bound) const {
  for (int j = 1; j <= n_; ++j) {
    if (absl::Status row = FillRow(table, j, preferred, memory_bound); !row.ok()) return row;
    table.FinishRow(j);
    if (table.kmax(j) == 0) {
      if (!preferred) {
        const Sample& s = samples_[order_[j - 1]];
        return absl::FailedPreconditionError(absl::StrCat(
            "sample ", s.id, " (", s.input, " tokens) does not fit in memory on its own with ", RecomputeName(r_),
            " recomputation; the limit is ", static_cast<int64_t>(costs_.model().memory().limit_mb),
            " MB per device"));
      }
      return false;
    }
  }
  return true;
}

absl::Status TableFiller::FillRow(CostTable& table, int j, bool preferred, bool* memory_bound) const {
  const WorkModel& work = costs_.model().work();
  int enc = 0, dec = 0;
  int64_t sum_sq = 0;
  for (int k = 1; k <= std::min(j, kcap_); ++k) {
    const Sample& s = samples_[order_[j - k]];
    enc = std::max(enc, EncLen(s));
    dec = std::max(dec, DecLen(s, ed_));
    sum_sq += static_cast<int64_t>(EncLen(s)) * EncLen(s);
    const Shape shape = WorkShape(
        {k, RoundUp(enc, options_.round_multiple), dec > 0 ? RoundUp(dec, options_.round_multiple) : 0}, sum_sq,
        work);
    auto c = costs_.Time(shape, r_);
    if (!c.ok()) {
      *memory_bound = true;  // out of profile: treat like a memory limit (no prune)
      if (k == 1 && !preferred) {
        return absl::FailedPreconditionError(absl::StrCat("sample ", s.id, " (", s.input, " tokens",
                                                          ed_ ? absl::StrCat(", ", s.target, " target") : "",
                                                          "): ", c.status().message()));
      }
      return absl::OkStatus();
    }
    if (!c->fits[preferred ? 1 : 0]) {  // memory grows with size and length
      *memory_bound = true;
      return absl::OkStatus();
    }
    // Costs grow with micro-batch size, so nothing further in this row can
    // be under the bound either (the single-sample entry is always kept).
    if (k > 1 && c->time_ms > bound_ms_) return absl::OkStatus();
    table.Push(j, c->time_ms);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::vector<MicroBatch>>> DynamicBatches(std::span<const Sample> samples, std::span<const int> order,
                                                       ShapeCosts& costs, Recompute r, const DpOptions& dp,
                                                       const DynamicOptions& options, DynamicStats* stats) {
  const int n = static_cast<int>(order.size());
  const bool ed = costs.model().encoder_decoder();
  const TableFiller filler(samples, order, costs, r, options, ObjectiveBound(samples, order, costs, r, dp, options));
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool preferred = attempt == 0;
    CostTable table(n);
    bool memory_bound = false;
    absl::StatusOr<bool> all_fit = filler.Fill(table, preferred, &memory_bound);
    if (!all_fit.ok()) return all_fit.status();
    if (!*all_fit) continue;
    DpOptions o = dp;
    o.tolerance = options.tolerance;
    o.keep = std::max(1, options.candidates);
    auto result = SolveDp(table, o);
    if (!result.ok()) return result.status();
    if (stats != nullptr) *stats = {*result, memory_bound};
    std::vector<std::vector<MicroBatch>> out;
    for (const auto& split : result->alternatives) {
      out.push_back(FromSplit(samples, order, split.ends, options.round_multiple, ed));
      ApplyWork(samples, costs.model().work(), std::span<MicroBatch>(out.back()));
    }
    return out;
  }
  return absl::InternalError("unreachable");
}

std::vector<MicroBatch> PaddingBatches(std::span<const Sample> samples, int mbs, int round_multiple,
                                       bool encoder_decoder) {
  std::vector<int> all(samples.size());
  std::iota(all.begin(), all.end(), 0);
  const Shape global = PaddedShape(samples, all, round_multiple, encoder_decoder);
  std::vector<MicroBatch> out;
  for (size_t b = 0; b < samples.size(); b += mbs) {
    MicroBatch mb;
    const size_t e = std::min(samples.size(), b + mbs);
    mb.shape = {static_cast<int>(e - b), global.seq, global.dec_seq};
    for (size_t i = b; i < e; ++i) mb.samples.push_back({static_cast<int>(i), static_cast<int>(i - b), 0});
    out.push_back(std::move(mb));
  }
  return out;
}

std::vector<MicroBatch> PackingBatches(std::span<const Sample> samples, int rows, int row_len, int round_multiple,
                                       bool encoder_decoder) {
  std::vector<int> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return samples[a].input > samples[b].input; });
  struct Row {
    int enc = 0, dec = 0;
    std::vector<Placement> items;
  };
  std::vector<Row> packed;
  for (int i : order) {
    const int enc = std::min(EncLen(samples[i]), row_len);
    const int dec = std::min(DecLen(samples[i], encoder_decoder), row_len);
    Row* target = nullptr;
    for (Row& row : packed) {  // first fit
      if (row.enc + enc <= row_len && row.dec + dec <= row_len) {
        target = &row;
        break;
      }
    }
    if (target == nullptr) {
      packed.emplace_back();
      target = &packed.back();
    }
    target->items.push_back({i, 0, target->enc});
    target->enc += enc;
    target->dec += dec;
  }
  std::vector<MicroBatch> out;
  for (size_t b = 0; b < packed.size(); b += rows) {
    MicroBatch mb;
    mb.packed = true;
    const size_t e = std::min(packed.size(), b + rows);
    mb.shape = {static_cast<int>(e - b), RoundUp(row_len, round_multiple),
                encoder_decoder ? RoundUp(row_len, round_multiple) : 0};
    for (size_t r = b; r < e; ++r) {
      for (Placement p : packed[r].items) {
        p.row = static_cast<int>(r - b);
        mb.samples.push_back(p);
      }
    }
    out.push_back(std::move(mb));
  }
  return out;
}

std::vector<MicroBatch> TokenBasedBatches(std::span<const Sample> samples, std::span<const int> order,
                                          int64_t budget, int round_multiple, bool encoder_decoder) {
  std::vector<int> ends;
  int enc = 0, dec = 0, begin = 0;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const Sample& s = samples[order[i]];
    const int ne = std::max(enc, EncLen(s)), nd = std::max(dec, DecLen(s, encoder_decoder));
    const int64_t tokens = static_cast<int64_t>(i - begin + 1) *
                           (RoundUp(ne, round_multiple) + (nd > 0 ? RoundUp(nd, round_multiple) : 0));
    if (i > begin && tokens > budget) {
      ends.push_back(i);
      begin = i;
      enc = EncLen(s);
      dec = DecLen(s, encoder_decoder);
    } else {
      enc = ne;
      dec = nd;
    }
  }
  if (!order.empty()) ends.push_back(static_cast<int>(order.size()));
  return FromSplit(samples, order, ends, round_multiple, encoder_decoder);
}

std::vector<MicroBatch> FixedBatches(std::span<const Sample> samples, std::span<const int> order, int mbs,
                                     int round_multiple, bool encoder_decoder) {
  std::vector<int> ends;
  for (int e = mbs; e < static_cast<int>(order.size()); e += mbs) ends.push_back(e);
  if (!order.empty()) ends.push_back(static_cast<int>(order.size()));
  return FromSplit(samples, order, ends, round_multiple, encoder_decoder);
}

double PaddingEfficiency(std::span<const Sample> samples, std::span<const MicroBatch> mbs, bool encoder_decoder) {
  double real = 0, computed = 0;
  for (const MicroBatch& mb : mbs) {
    computed += static_cast<double>(mb.shape.mbs) * (mb.shape.seq + mb.shape.dec_seq);
    for (const Placement& p : mb.samples) {
      real += EncLen(samples[p.sample]) + DecLen(samples[p.sample], encoder_decoder);
    }
  }
  return computed > 0 ? real / computed : 0;
}

}  // namespace dynapipe::planner
