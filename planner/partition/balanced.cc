#include "planner/partition/balanced.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

#include "planner/partition/batching.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner {
namespace {

int EncOf(const Sample& s) { return s.input; }
int DecOf(const Sample& s, bool encoder_decoder) { return encoder_decoder ? s.target : 0; }

// First-fit-decreasing of `items` (sorted longest first) into `rows` rows of
// `seq` (and `dec_seq`) tokens; the placements, or empty when they do not fit.
Placements FirstFit(std::span<const Sample> samples, std::span<const int> items, int rows, int seq, int dec_seq,
                     bool encoder_decoder, int* rows_used) {
  std::vector<int> enc(rows, 0), dec(rows, 0);
  Placements out;
  out.reserve(items.size());
  int used = 0;
  for (int i : items) {
    const int e = EncOf(samples[i]), d = DecOf(samples[i], encoder_decoder);
    int row = 0;
    while (row < used && (enc[row] + e > seq || dec[row] + d > dec_seq)) ++row;
    if (row == used) {
      if (used == rows) return {};
      ++used;
    }
    out.push_back({i, row, enc[row]});
    enc[row] += e;
    dec[row] += d;
  }
  *rows_used = used;
  return out;
}

// Deals `weights.size()` micro-batches to `groups` groups, `per_group` each:
// heaviest first onto the lightest group with room.
std::vector<int> DealToGroups(std::span<const double> weights, int groups) {
  const int n = static_cast<int>(weights.size());
  const int room = (n + groups - 1) / groups;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weights[a] > weights[b]; });
  std::vector<double> load(groups, 0);
  std::vector<int> count(groups, 0), group_of(n, 0);
  for (int i : order) {
    int best = -1;
    for (int g = 0; g < groups; ++g) {
      if (count[g] < room && (best < 0 || load[g] < load[best])) best = g;
    }
    group_of[i] = best;
    load[best] += weights[i];
    ++count[best];
  }
  return group_of;
}

// Samples heaviest first (ties: longer, then index) by `w`.
std::vector<int> HeaviestFirst(std::span<const Sample> samples, const CostWeights& w, bool encoder_decoder) {
  std::vector<int> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const double wa = w.Of(samples[a], encoder_decoder), wb = w.Of(samples[b], encoder_decoder);
    if (wa != wb) return wa > wb;
    return samples[a].input > samples[b].input;
  });
  return order;
}

// Bins of samples packed and dealt to groups (the last step of both balanced partitioners).
std::vector<MicroBatch> PackAndDeal(std::span<const Sample> samples, std::vector<std::vector<int>> bins,
                                    std::span<const double> load, int row_len, int round_multiple,
                                    bool encoder_decoder, bool tight, int groups) {
  const std::vector<int> group_of = DealToGroups(load, groups);
  std::vector<MicroBatch> out;
  for (size_t b = 0; b < bins.size(); ++b) {
    if (bins[b].empty()) continue;
    out.push_back(PackRows(samples, std::move(bins[b]), row_len, round_multiple, encoder_decoder, tight));
    out.back().group = group_of[b];
  }
  return out;
}

}  // namespace

std::vector<double> RampTargets(int count, const Ramp& ramp) {
  std::vector<double> target(count, 1.0);
  if (count < 3) return target;
  const int head = std::max(1, ramp.length), tail = std::max(1, ramp.TailLength());
  auto rise = [&](int k, int length) { return k < length ? ramp.edge + (1.0 - ramp.edge) * k / length : 1.0; };
  for (int k = 0; k < count; ++k) target[k] = std::min(rise(k, head), rise(count - 1 - k, tail));
  return target;
}

absl::StatusOr<CostWeights> CostWeightsOf(ShapeCosts& costs, Recompute r, int row_len, int round_multiple) {
  const WorkModel& work = costs.model().work();
  const bool ed = costs.model().encoder_decoder();
  absl::Status last = absl::OkStatus();
  // The longest probe the cost model answers (a profile may stop short of
  // two full rows).
  for (int len = RoundUp(row_len, round_multiple); len >= round_multiple; len = RoundUp(len / 2, round_multiple)) {
    const int64_t L = len;
    const int dec = ed ? len : 0;
    auto one_long = costs.Time(WorkShape({1, len, dec}, L * L, work), r);
    auto short_row = costs.Time(WorkShape({1, len, dec}, L, work), r);
    auto two_short = costs.Time(WorkShape({2, len, dec}, 2 * L, work), r);
    if (one_long.ok() && short_row.ok() && two_short.ok()) {
      CostWeights w;
      w.per_pair_ms = L > 1 ? std::max(0.0, (one_long->time_ms - short_row->time_ms) / static_cast<double>(L * L - L)) : 0;
      w.per_token_ms = (two_short->time_ms - short_row->time_ms) / static_cast<double>(L + dec) -
                       w.per_pair_ms * L / static_cast<double>(L + dec);
      if (!(w.per_token_ms > 0)) w.per_token_ms = 1e-6;  // a model that does not grow with tokens: balance tokens
      w.per_micro_batch_ms =
          std::max(0.0, short_row->time_ms - w.per_token_ms * (L + dec) - w.per_pair_ms * static_cast<double>(L));
      return w;
    }
    for (const auto* s : {&one_long, &short_row, &two_short}) {
      if (!s->ok()) last = s->status();
    }
    if (len == round_multiple) break;
  }
  return last;
}

MicroBatch PackRows(std::span<const Sample> samples, std::vector<int> items, int max_row, int round_multiple,
                    bool encoder_decoder, bool tight) {
  std::stable_sort(items.begin(), items.end(), [&](int a, int b) {
    if (EncOf(samples[a]) != EncOf(samples[b])) return EncOf(samples[a]) > EncOf(samples[b]);
    return DecOf(samples[a], encoder_decoder) > DecOf(samples[b], encoder_decoder);
  });
  const int cap = RoundUp(max_row, round_multiple);
  const int n = static_cast<int>(items.size());
  MicroBatch mb;
  mb.packed = true;
  int rows = 0;
  if (!tight) {
    mb.samples = FirstFit(samples, items, n, cap, encoder_decoder ? cap : 0, encoder_decoder, &rows);
    mb.shape = {rows, cap, encoder_decoder ? cap : 0};
    return mb;
  }
  int64_t total_enc = 0, total_dec = 0;
  int longest_enc = 0, longest_dec = 0;
  for (int i : items) {
    total_enc += EncOf(samples[i]);
    total_dec += DecOf(samples[i], encoder_decoder);
    longest_enc = std::max(longest_enc, EncOf(samples[i]));
    longest_dec = std::max(longest_dec, DecOf(samples[i], encoder_decoder));
  }
  int64_t best_grid = std::numeric_limits<int64_t>::max();
  const int step = std::max(round_multiple, RoundUp(cap / 64, round_multiple));
  const int first = static_cast<int>(std::max<int64_t>(1, (total_enc + cap - 1) / cap));
  for (int r = first; r <= n; ++r) {
    auto at_least = [&](int64_t total, int longest) {
      return RoundUp(static_cast<int>(std::max<int64_t>(longest, (total + r - 1) / r)), round_multiple);
    };
    int seq = std::min(cap, at_least(total_enc, longest_enc));
    int dec = encoder_decoder ? std::min(cap, at_least(total_dec, longest_dec)) : 0;
    if (static_cast<int64_t>(r) * (seq + dec) >= best_grid) break;  // grows with r from here on
    for (;;) {
      int used = 0;
      Placements placed = FirstFit(samples, items, r, seq, dec, encoder_decoder, &used);
      if (!placed.empty() && static_cast<int64_t>(used) * (seq + dec) < best_grid) {
        best_grid = static_cast<int64_t>(used) * (seq + dec);
        mb.samples = std::move(placed);
        mb.shape = {used, seq, dec};
        break;
      }
      if (!placed.empty() || (seq == cap && (dec == cap || !encoder_decoder))) break;
      seq = std::min(cap, seq + step);
      if (encoder_decoder) dec = std::min(cap, dec + step);
      if (static_cast<int64_t>(r) * (seq + dec) >= best_grid) break;
    }
  }
  return mb;
}

std::vector<MicroBatch> BalancedBatches(std::span<const Sample> samples, int groups, int per_group,
                                        const CostWeights& w, int row_len, int round_multiple, bool encoder_decoder,
                                        const Ramp& ramp) {
  per_group = std::max(1, std::min(per_group, static_cast<int>(samples.size()) / std::max(1, groups)));
  // Groups first (heaviest sample onto the lightest group), so their loads
  // differ by at most one sample; then each group's micro-batches.
  std::vector<std::vector<int>> of_group(groups);
  std::vector<double> group_load(groups, 0);
  const std::vector<int> heaviest = HeaviestFirst(samples, w, encoder_decoder);
  for (int i : heaviest) {
    const int g = static_cast<int>(std::min_element(group_load.begin(), group_load.end()) - group_load.begin());
    of_group[g].push_back(i);
    group_load[g] += w.Of(samples[i], encoder_decoder);
  }
  const std::vector<double> target = RampTargets(per_group, ramp);
  // One min-heap of (load, micro-batch) per distinct target: a sample goes
  // to the micro-batch whose load over target is lowest once it is added,
  // so a heavy sample never lands in a light edge micro-batch while a
  // middle one has room.
  std::vector<double> levels(target.begin(), target.end());
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  using Slot = std::pair<double, int>;
  using MinHeap = std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>>;
  std::vector<MicroBatch> out;
  for (int g = 0; g < groups; ++g) {
    std::vector<std::vector<int>> members(per_group);
    std::vector<MinHeap> heaps(levels.size());
    for (int b = 0; b < per_group; ++b) {
      heaps[std::lower_bound(levels.begin(), levels.end(), target[b]) - levels.begin()].push({0.0, b});
    }
    for (int i : of_group[g]) {  // heaviest first
      const double wi = w.Of(samples[i], encoder_decoder);
      size_t best = 0;
      double best_ratio = std::numeric_limits<double>::infinity();
      for (size_t l = 0; l < heaps.size(); ++l) {
        const double ratio = (heaps[l].top().first + wi) / levels[l];
        if (ratio < best_ratio) {
          best_ratio = ratio;
          best = l;
        }
      }
      const auto [load, b] = heaps[best].top();
      heaps[best].pop();
      members[b].push_back(i);
      heaps[best].push({load + wi, b});
    }
    for (int b = 0; b < per_group; ++b) {
      if (members[b].empty()) continue;
      out.push_back(PackRows(samples, std::move(members[b]), row_len, round_multiple, encoder_decoder, /*tight=*/true));
      out.back().group = g;
    }
  }
  return out;
}

namespace {

// Padded shapes of contiguous runs of `order`: the longest input (and
// target) of any run from sparse tables of range maxima, O(1) per run.
class RunShapes {
 public:
  RunShapes(std::span<const Sample> samples, std::span<const int> order, int round_multiple, bool ed)
      : round_(round_multiple), n_(static_cast<int>(order.size())) {
    levels_ = 1;
    while ((1 << levels_) <= n_) ++levels_;
    enc_.assign(static_cast<size_t>(levels_) * n_, 0);
    dec_.assign(static_cast<size_t>(levels_) * n_, 0);
    for (int i = 0; i < n_; ++i) {
      enc_[i] = EncOf(samples[order[i]]);
      dec_[i] = DecOf(samples[order[i]], ed);
    }
    for (int l = 1; l < levels_; ++l) {
      for (int i = 0; i + (1 << l) <= n_; ++i) {
        const size_t at = static_cast<size_t>(l) * n_ + i, lo = static_cast<size_t>(l - 1) * n_ + i;
        enc_[at] = std::max(enc_[lo], enc_[lo + (1 << (l - 1))]);
        dec_[at] = std::max(dec_[lo], dec_[lo + (1 << (l - 1))]);
      }
    }
  }
  // The padded shape of order[begin, end), begin < end <= size.
  Shape Of(int begin, int end) const {
    int l = 0;
    while ((2 << l) <= end - begin) ++l;
    const size_t a = static_cast<size_t>(l) * n_ + begin, b = static_cast<size_t>(l) * n_ + end - (1 << l);
    const int e = std::max(enc_[a], enc_[b]), d = std::max(dec_[a], dec_[b]);
    return Shape{end - begin, RoundUp(e, round_), d > 0 ? RoundUp(d, round_) : 0};
  }
  int size() const { return n_; }

 private:
  int round_, n_, levels_ = 1;
  std::vector<int> enc_, dec_;  // [level][i]: max over [i, i + 2^level)
};

// Cuts the runs' order into at most target.size() contiguous runs, run k
// costing at most target[k] * unit (a lone sample always forms a run); the
// run ends, or empty when the runs do not cover it or a lone sample does not
// fit. A run's cost grows with its end (more rows, rows no shorter), so each
// end is found by galloping and bisection rather than sample by sample.
std::vector<int> CutRuns(const RunShapes& shapes, std::span<const double> target, double unit, ShapeCosts& costs,
                         Recompute r) {
  const int n = shapes.size();
  auto within = [&](int begin, int end, double limit) {
    auto t = costs.Time(shapes.Of(begin, end), r);
    return t.ok() && t->fits[0] && t->time_ms <= limit;
  };
  std::vector<int> ends;
  int begin = 0;
  for (size_t k = 0; k < target.size() && begin < n; ++k) {
    auto lone = costs.Time(shapes.Of(begin, begin + 1), r);
    if (!lone.ok() || !lone->fits[0]) return {};
    const double limit = target[k] * unit;
    int good = begin + 1, bad = n + 1;  // ends known within / not within
    for (int step = 1; good < n;) {
      const int probe = std::min(n, good + step);
      if (!within(begin, probe, limit)) {
        bad = probe;
        break;
      }
      good = probe;
      step *= 2;
    }
    while (bad - good > 1 && good < n) {
      const int mid = good + (bad - good) / 2;
      if (within(begin, mid, limit)) {
        good = mid;
      } else {
        bad = mid;
      }
    }
    ends.push_back(good);
    begin = good;
  }
  if (begin < n) return {};
  return ends;
}

// `order` dealt to `groups` by each sample's own padded cost: heaviest first
// onto the lightest group, each group's members kept in `order`'s order,
// and each group's costs summed in that order into `lone`. Empty when a
// lone sample has no cost (out of the model's range).
std::vector<std::vector<int>> GroupsByCost(std::span<const Sample> samples, std::span<const int> order, int groups,
                                           ShapeCosts& costs, Recompute r, int round_multiple,
                                           std::vector<double>& lone) {
  const bool ed = costs.model().encoder_decoder();
  const int n = static_cast<int>(order.size());
  std::vector<double> cost(n);
  for (int k = 0; k < n; ++k) {
    auto t = costs.Time(PaddedShape(samples, order.subspan(k, 1), round_multiple, ed), r);
    if (!t.ok()) return {};
    cost[k] = t->time_ms;
  }
  std::vector<int> by_cost(n);
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int a, int b) { return cost[a] > cost[b]; });
  std::vector<double> load(groups, 0);
  std::vector<int> group_of(n);
  for (int k : by_cost) {
    const int g = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    group_of[k] = g;
    load[g] += cost[k];
  }
  std::vector<std::vector<int>> of_group(groups);
  lone.assign(groups, 0);
  for (int k = 0; k < n; ++k) {
    of_group[group_of[k]].push_back(order[k]);
    lone[group_of[k]] += cost[k];
  }
  return of_group;
}

}  // namespace

std::vector<MicroBatch> RampedRuns(std::span<const Sample> samples, std::span<const int> order, int groups,
                                   int per_group, const Ramp& ramp, ShapeCosts& costs, Recompute r,
                                   int round_multiple) {
  return RampedRunMaker(samples, order, groups, costs, r, round_multiple).Make(per_group, ramp);
}

RampedRunMaker::RampedRunMaker(std::span<const Sample> samples, std::span<const int> order, int groups,
                               ShapeCosts& costs, Recompute r, int round_multiple)
    : samples_(samples), costs_(costs), r_(r), round_multiple_(round_multiple) {
  of_group_ = GroupsByCost(samples, order, groups, costs, r, round_multiple, lone_);
}

std::vector<MicroBatch> RampedRunMaker::Make(int per_group, const Ramp& ramp) const {
  if (of_group_.empty()) return {};
  const bool ed = costs_.model().encoder_decoder();
  // Runs are cut along the order with targets ascending (the cheapest on the
  // shortest samples); run k then takes the position of the k-th lightest
  // target in the execution order, later positions first among equal
  // targets: the heaviest runs (lone long samples past their target) come
  // right after the fill, and the work falls from there to the end, where a
  // backward's trip through every stage is hidden behind lighter ones.
  const std::vector<double> in_order = RampTargets(per_group, ramp);
  std::vector<int> position(per_group);
  std::iota(position.begin(), position.end(), 0);
  std::sort(position.begin(), position.end(), [&](int a, int b) {
    return in_order[a] != in_order[b] ? in_order[a] < in_order[b] : a > b;
  });
  std::vector<double> target(in_order);
  std::sort(target.begin(), target.end());
  std::vector<MicroBatch> out;
  for (size_t g = 0; g < of_group_.size(); ++g) {
    const std::vector<int>& mine = of_group_[g];
    if (static_cast<int>(mine.size()) < per_group) return {};
    // The smallest unit whose runs cover the group, by bisection from the
    // unit at which the samples' lone costs would meet the targets (runs
    // cost less than their samples alone, so it nearly always covers).
    const RunShapes shapes(samples_, mine, round_multiple_, ed);
    double hi = std::max(1e-9, lone_[g] / std::accumulate(target.begin(), target.end(), 0.0));
    std::vector<int> ends;
    for (int i = 0; i < 60 && (ends = CutRuns(shapes, target, hi, costs_, r_)).empty(); ++i) {
      hi *= 2;
    }
    if (ends.empty()) return {};
    // Halve while the runs still cover: the unit then lies in (lo, 2 lo].
    double lo = hi / 2;
    for (int i = 0; i < 60; ++i, lo /= 2) {
      std::vector<int> e = CutRuns(shapes, target, lo, costs_, r_);
      if (e.empty()) break;
      hi = lo;
      ends = std::move(e);
    }
    for (int i = 0; i < 6; ++i) {  // within 2^-6 of the bracket, under 2% of the unit
      const double mid = 0.5 * (lo + hi);
      std::vector<int> e = CutRuns(shapes, target, mid, costs_, r_);
      if (e.empty()) {
        lo = mid;
      } else {
        hi = mid;
        ends = std::move(e);
      }
    }
    std::vector<MicroBatch> runs = FromSplit(samples_, mine, ends, round_multiple_, ed);
    std::vector<MicroBatch> placed(per_group);
    for (size_t k = 0; k < runs.size(); ++k) placed[position[k]] = std::move(runs[k]);
    for (MicroBatch& mb : placed) {
      if (mb.samples.empty()) continue;  // fewer runs than targets covered the group
      mb.group = static_cast<int>(g);
      out.push_back(std::move(mb));
    }
  }
  return out;
}

std::vector<MicroBatch> PackingBalancedBatches(std::span<const Sample> samples, int rows, int row_len,
                                               int round_multiple, bool encoder_decoder, int groups) {
  std::vector<int> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return EncOf(samples[a]) + DecOf(samples[a], encoder_decoder) > EncOf(samples[b]) + DecOf(samples[b], encoder_decoder);
  });
  std::vector<std::vector<Sample>> per_group(groups);
  std::vector<std::vector<int>> index_of(groups);  // position in per_group -> index in samples
  std::vector<int64_t> tokens(groups, 0);
  for (int i : order) {
    const int g = static_cast<int>(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    tokens[g] += EncOf(samples[i]) + DecOf(samples[i], encoder_decoder);
    per_group[g].push_back(samples[i]);
    index_of[g].push_back(i);
  }
  std::vector<MicroBatch> out;
  for (int g = 0; g < groups; ++g) {
    for (MicroBatch& mb : PackingBatches(per_group[g], rows, row_len, round_multiple, encoder_decoder)) {
      for (Placement& p : mb.samples) p.sample = index_of[g][p.sample];
      mb.group = g;
      out.push_back(std::move(mb));
    }
  }
  return out;
}

std::vector<MicroBatch> WlbBatches(std::span<const Sample> samples, int rows, int row_len, int round_multiple,
                                   const CostWeights& w, bool encoder_decoder, int groups) {
  const int64_t capacity = static_cast<int64_t>(rows) * row_len;
  int64_t enc_total = 0, dec_total = 0;
  for (const Sample& s : samples) {
    enc_total += EncOf(s);
    dec_total += DecOf(s, encoder_decoder);
  }
  const int64_t needed = (std::max(enc_total, dec_total) + capacity - 1) / capacity;
  int bins = static_cast<int>((needed + groups - 1) / groups * groups);
  std::vector<std::vector<int>> members(bins);
  std::vector<double> load(bins, 0);
  std::vector<int64_t> enc(bins, 0), dec(bins, 0);
  for (int i : HeaviestFirst(samples, w, encoder_decoder)) {
    const int e = EncOf(samples[i]), d = DecOf(samples[i], encoder_decoder);
    int best = -1;
    for (int b = 0; b < bins; ++b) {
      if (enc[b] + e <= capacity && dec[b] + d <= capacity && (best < 0 || load[b] < load[best])) best = b;
    }
    if (best < 0) {
      best = bins++;
      members.emplace_back();
      load.push_back(0);
      enc.push_back(0);
      dec.push_back(0);
    }
    members[best].push_back(i);
    load[best] += w.Of(samples[i], encoder_decoder);
    enc[best] += e;
    dec[best] += d;
  }
  return PackAndDeal(samples, std::move(members), load, row_len, round_multiple, encoder_decoder, /*tight=*/false,
                     groups);
}

}  // namespace dynapipe::planner
