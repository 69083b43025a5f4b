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
std::vector<Placement> FirstFit(std::span<const Sample> samples, std::span<const int> items, int rows, int seq,
                                int dec_seq, bool encoder_decoder, int* rows_used) {
  std::vector<int> enc(rows, 0), dec(rows, 0);
  std::vector<Placement> out;
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
  const int length = std::max(1, ramp.length);
  for (int k = 0; k < count; ++k) {
    const int from_end = std::min(k, count - 1 - k);
    if (from_end < length) target[k] = ramp.edge + (1.0 - ramp.edge) * from_end / length;
  }
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
      std::vector<Placement> placed = FirstFit(samples, items, r, seq, dec, encoder_decoder, &used);
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

// Cuts `order` into at most `runs` contiguous runs, run k costing at most
// target[k] * unit (a lone sample always forms a run); the run ends, or empty
// when `runs` do not cover it or a lone sample does not fit.
std::vector<int> CutRuns(std::span<const Sample> samples, std::span<const int> order, std::span<const double> target,
                         double unit, ShapeCosts& costs, Recompute r, int round_multiple, bool ed) {
  std::vector<int> ends;
  size_t begin = 0;
  for (size_t k = 0; k < target.size() && begin < order.size(); ++k) {
    size_t end = begin + 1;
    int enc = EncOf(samples[order[begin]]), dec = DecOf(samples[order[begin]], ed);
    for (; end < order.size(); ++end) {
      const Sample& next = samples[order[end]];
      const int e = std::max(enc, EncOf(next)), d = std::max(dec, DecOf(next, ed));
      const Shape shape{static_cast<int>(end + 1 - begin), RoundUp(e, round_multiple),
                        d > 0 ? RoundUp(d, round_multiple) : 0};
      auto t = costs.Time(shape, r);
      if (!t.ok() || !t->fits[0] || t->time_ms > target[k] * unit) break;
      enc = e;
      dec = d;
    }
    auto lone = costs.Time(PaddedShape(samples, order.subspan(begin, 1), round_multiple, ed), r);
    if (!lone.ok() || !lone->fits[0]) return {};
    ends.push_back(static_cast<int>(end));
    begin = end;
  }
  if (begin < order.size()) return {};
  return ends;
}

}  // namespace

std::vector<MicroBatch> RampedRuns(std::span<const Sample> samples, std::span<const int> order, int groups,
                                   int per_group, const Ramp& ramp, ShapeCosts& costs, Recompute r,
                                   int round_multiple) {
  const bool ed = costs.model().encoder_decoder();
  std::vector<std::vector<int>> of_group(groups);
  for (size_t i = 0; i < order.size(); ++i) of_group[i % groups].push_back(order[i]);
  // Targets ascending along the order; runs then placed outside in: the
  // cheapest first, the next last, and so on.
  std::vector<double> target = RampTargets(per_group, ramp);
  std::sort(target.begin(), target.end());
  std::vector<int> position(per_group);
  for (int k = 0, lo = 0, hi = per_group - 1; k < per_group; ++k) position[k] = k % 2 == 0 ? lo++ : hi--;
  std::vector<MicroBatch> out;
  for (int g = 0; g < groups; ++g) {
    const std::vector<int>& mine = of_group[g];
    if (static_cast<int>(mine.size()) < per_group) return {};
    // The smallest unit whose runs cover the group (bisection over cost).
    double hi = 1;
    std::vector<int> ends;
    for (int i = 0; i < 60 && (ends = CutRuns(samples, mine, target, hi, costs, r, round_multiple, ed)).empty(); ++i) {
      hi *= 2;
    }
    if (ends.empty()) return {};
    double lo = 0;
    for (int i = 0; i < 14; ++i) {  // the unit within 2^-14 of the doubling's bracket
      const double mid = 0.5 * (lo + hi);
      std::vector<int> e = CutRuns(samples, mine, target, mid, costs, r, round_multiple, ed);
      if (e.empty()) {
        lo = mid;
      } else {
        hi = mid;
        ends = std::move(e);
      }
    }
    std::vector<MicroBatch> runs = FromSplit(samples, mine, ends, round_multiple, ed);
    std::vector<MicroBatch> placed(per_group);
    for (size_t k = 0; k < runs.size(); ++k) placed[position[k]] = std::move(runs[k]);
    for (MicroBatch& mb : placed) {
      if (mb.samples.empty()) continue;  // fewer runs than targets covered the group
      mb.group = g;
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
