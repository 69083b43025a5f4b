#include "planner/schedule_search.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "src/common/status_macros.h"

namespace dynapipe::planner {

absl::StatusOr<GroupCosts> CostsOf(std::span<const MicroBatch> mbs, ShapeCosts& costs, Recompute r) {
  GroupCosts out;
  out.chunks = costs.model().num_chunks();
  out.table.resize(mbs.size() * out.chunks);
  for (size_t m = 0; m < mbs.size(); ++m) {
    RETURN_IF_ERROR(costs.Chunks(mbs[m].shape, r, std::span<ChunkCost>(out.table).subspan(m * out.chunks, out.chunks)));
  }
  return out;
}

PipelineTimes GroupTimes(std::span<const MicroBatch> mbs, const GroupCosts& costs, const PipelineModel& pm,
                         const CommModel& comm, int dp_rank) {
  const int D = pm.num_devices(), C = pm.num_chunks();
  PipelineTimes t;
  t.Resize(D, C, static_cast<int>(mbs.size()));
  for (int c = 0; c < C; ++c) t.chunk_device[c] = pm.chunks()[c].device;
  for (int d = 0; d < D; ++d) t.static_mb[d] = pm.StaticMb(d);
  // A cost model that measured transfers overrides the cluster's figures.
  const OverheadTerms overheads = pm.cost_model().Overheads();
  const bool measured_transfers = overheads.transfer_latency_ms >= 0 && overheads.transfer_ms_per_mb >= 0;
  for (size_t m = 0; m < mbs.size(); ++m) {
    for (int c = 0; c < C; ++c) {
      const size_t i = t.At(static_cast<int>(m), c);
      const ChunkCost& cc = costs.At(static_cast<int>(m), c);
      t.fw_ms[i] = cc.fw_ms;
      t.bw_ms[i] = cc.bw_ms;
      t.stored_mb[i] = cc.stored_mb;
      t.peak_mb[i] = cc.peak_mb;
      if (c + 1 < C) {
        const int a = dp_rank * D + t.chunk_device[c], b = dp_rank * D + t.chunk_device[c + 1];
        const double mbytes = pm.BoundaryMb(mbs[m].shape, c);
        if (a == b) continue;
        if (measured_transfers) {
          t.comm_fw_ms[i] = t.comm_bw_ms[i] = overheads.transfer_latency_ms + mbytes * overheads.transfer_ms_per_mb;
        } else {
          t.comm_fw_ms[i] = comm.TransferMs(a, b, mbytes);
          t.comm_bw_ms[i] = comm.TransferMs(b, a, mbytes);
        }
      }
    }
  }
  return t;
}

PipelineTimes Permute(const PipelineTimes& base, std::span<const int> order) {
  PipelineTimes t = base;
  const int C = base.num_chunks;
  for (size_t m = 0; m < order.size(); ++m) {
    for (int c = 0; c < C; ++c) {
      const size_t to = t.At(static_cast<int>(m), c), from = base.At(order[m], c);
      t.fw_ms[to] = base.fw_ms[from];
      t.bw_ms[to] = base.bw_ms[from];
      t.stored_mb[to] = base.stored_mb[from];
      t.peak_mb[to] = base.peak_mb[from];
      t.comm_fw_ms[to] = base.comm_fw_ms[from];
      t.comm_bw_ms[to] = base.comm_bw_ms[from];
    }
  }
  return t;
}

double MakespanLowerBound(const GroupCosts& costs, const PipelineModel& pm) {
  const int D = pm.num_devices(), C = pm.num_chunks(), mbs = costs.size();
  std::vector<int> first_chunk(D, C);
  for (int c = C - 1; c >= 0; --c) first_chunk[pm.chunks()[c].device] = c;
  std::vector<double> work(D, 0);
  std::vector<double> fill(D, std::numeric_limits<double>::infinity()), drain = fill;
  for (int m = 0; m < mbs; ++m) {
    double fw_before = 0, bw_before = 0;  // through chunks [0, c)
    for (int c = 0; c < C; ++c) {
      const int d = pm.chunks()[c].device;
      if (c == first_chunk[d]) {
        fill[d] = std::min(fill[d], fw_before);
        drain[d] = std::min(drain[d], bw_before);
      }
      const ChunkCost& cc = costs.At(m, c);
      work[d] += cc.fw_ms + cc.bw_ms;
      fw_before += cc.fw_ms;
      bw_before += cc.bw_ms;
    }
  }
  double bound = 0;
  for (int d = 0; d < D; ++d) {
    if (first_chunk[d] < C && mbs > 0) bound = std::max(bound, work[d] + fill[d] + drain[d]);
  }
  return bound;
}

double OrderLowerBound(const PipelineTimes& t, std::span<const int> order) {
  const int C = t.num_chunks, M = static_cast<int>(order.size());
  if (C != t.num_devices || M == 0) return 0;
  std::vector<bool> used(t.num_devices, false);
  for (int c = 0; c < C; ++c) {
    if (used[t.chunk_device[c]]) return 0;
    used[t.chunk_device[c]] = true;
  }
  const int L = C - 1;
  auto at = [&](int pos, int c) { return t.At(order[pos], c); };
  if (L == 0) {  // one device: its work
    double work = 0;
    for (int k = 0; k < M; ++k) work += t.fw_ms[at(k, 0)] + t.bw_ms[at(k, 0)];
    return work;
  }
  // Chain (j, k), j <= k: on chunk 0 the forwards up to j's, j's forward up
  // to L, on L every op from j's forward to k's backward, k's backward down
  // to chunk 0, there the backwards from k's on. It splits at the last
  // chunk: A(j) + D(k), with L's ops before j's forward taken out of A and
  // L's ops up to k's backward put into D. Transfers count as their own time
  // (one may also wait for the link; GroupTimes leaves them 0 between chunks
  // on one device).
  double bw0_rest = 0;  // chunk 0's backwards from k's on
  for (int k = 0; k < M; ++k) bw0_rest += t.bw_ms[at(k, 0)];
  double bound = 0, best_a = -std::numeric_limits<double>::infinity();
  double fw0_through = 0, last_before = 0;  // chunk 0's forwards up to k's; L's ops before k's
  for (int k = 0; k < M; ++k) {
    double up = 0, down = 0;  // k's forward from chunk 1 to L - 1, its backward from L - 1 to 1, with transfers
    for (int c = 0; c < L; ++c) {
      up += t.comm_fw_ms[at(k, c)] + (c > 0 ? t.fw_ms[at(k, c)] : 0.0);
      down += t.comm_bw_ms[at(k, c)] + (c > 0 ? t.bw_ms[at(k, c)] : 0.0);
    }
    const double on_last = t.fw_ms[at(k, L)] + t.bw_ms[at(k, L)];
    fw0_through += t.fw_ms[at(k, 0)];
    best_a = std::max(best_a, fw0_through + up - last_before);
    last_before += on_last;
    bound = std::max(bound, best_a + last_before + down + bw0_rest);
    bw0_rest -= t.bw_ms[at(k, 0)];
  }
  return bound;
}

namespace {

// The tent: micro-batches by their work, the cheapest at both ends and the
// dearest a quarter of the way in, the fill ramp a third as long as the
// drain (every third of the cheapest goes to the fill). Small micro-batches
// fill and drain the pipeline while the big ones run with every stage busy;
// a partition's own order (the identity) may lack it, as token-based and
// fixed-size splits do.
std::vector<int> TentOrder(const PipelineTimes& t) {
  const int n = t.num_mb;
  std::vector<double> work(n, 0);
  for (int m = 0; m < n; ++m) {
    for (int c = 0; c < t.num_chunks; ++c) work[m] += t.fw_ms[t.At(m, c)] + t.bw_ms[t.At(m, c)];
  }
  std::vector<int> by_work(n);
  std::iota(by_work.begin(), by_work.end(), 0);
  std::stable_sort(by_work.begin(), by_work.end(), [&](int a, int b) { return work[a] < work[b]; });
  // n / 4, rounded: the fill's every third reaches it by rank 3 (fill - 1) < n.
  const int fill = (n + 2) / 4;
  std::vector<int> up, down;
  for (int r = 0; r < n; ++r) (static_cast<int>(up.size()) < fill && r % 3 == 0 ? up : down).push_back(by_work[r]);
  up.insert(up.end(), down.rbegin(), down.rend());
  return up;
}

std::vector<std::vector<int>> Orders(const PipelineTimes& t, const SearchOptions& o) {
  const int n = t.num_mb;
  std::vector<std::vector<int>> out;
  std::vector<int> id(n);
  std::iota(id.begin(), id.end(), 0);
  out.push_back(id);
  if (o.permutations >= 2 && n > 2) {
    std::vector<int> tent = TentOrder(t);
    if (tent != id) out.push_back(std::move(tent));
  }
  if (static_cast<int>(out.size()) < o.permutations && n > 1) out.emplace_back(id.rbegin(), id.rend());
  if (static_cast<int>(out.size()) < o.permutations && n > 2) {
    std::vector<int> zz;  // longest, shortest, second longest, ...
    for (int lo = 0, hi = n - 1; lo <= hi; --hi, ++lo) {
      zz.push_back(hi);
      if (lo != hi) zz.push_back(lo);
    }
    out.push_back(zz);
  }
  std::mt19937_64 rng(o.seed);
  for (int k = static_cast<int>(out.size()); k < o.permutations && n > 2; ++k) {
    std::shuffle(id.begin(), id.end(), rng);
    out.push_back(id);
  }
  return out;
}

// Simulates `kind` on `t` (the micro-batches in `order`) and takes it into
// `best` when it fits in `limit` MB and is faster; whether it did.
bool TrySchedule(const PipelineTimes& t, std::span<const int> order, ScheduleKind kind, double limit,
                 GroupSchedule& best) {
  if (!ScheduleApplies(kind, t)) return false;
  // Wait-free cyclic runs unconstrained first and memory-aware only if that
  // does not fit.
  for (int attempt = 0; attempt < (kind == ScheduleKind::kWaitFreeCyclic ? 2 : 1); ++attempt) {
    auto orders = MakeSchedule(kind, t, attempt == 0 ? std::numeric_limits<double>::infinity() : limit);
    if (!orders.ok()) return false;
    auto sim = Simulate(t, *orders, /*record=*/false);
    ++best.simulations;
    if (!sim.ok()) return false;
    if (std::any_of(sim->peak_mb.begin(), sim->peak_mb.end(), [limit](double p) { return p > limit; })) {
      ++best.memory_rejections;
      continue;
    }
    if (sim->makespan_ms >= best.makespan_ms) return false;
    best.found = true;
    best.kind = kind;
    best.order.assign(order.begin(), order.end());
    best.device_orders = std::move(*orders);
    best.makespan_ms = sim->makespan_ms;
    best.peak_mb = sim->peak_mb;
    return true;
  }
  return false;
}

}  // namespace

SearchOrders OrdersToSearch(const PipelineTimes& base, const SearchOptions& options) {
  SearchOrders s;
  s.orders = Orders(base, options);  // always has the identity
  s.bounds.reserve(s.orders.size());
  s.lower_bound = std::numeric_limits<double>::infinity();
  for (const std::vector<int>& order : s.orders) {
    s.bounds.push_back(OrderLowerBound(base, order));
    s.lower_bound = std::min(s.lower_bound, s.bounds.back());
  }
  return s;
}

GroupSchedule SearchSchedule(const PipelineTimes& base, const SearchOrders& orders, double limit,
                             const SearchOptions& options) {
  GroupSchedule best;
  best.makespan_ms = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < orders.orders.size(); ++i) {
    // The margin keeps rounding from skipping an equal schedule.
    if (orders.bounds[i] * (1 - 1e-9) >= best.makespan_ms) continue;
    const std::vector<int>& order = orders.orders[i];
    const PipelineTimes t = Permute(base, order);
    for (int k = 0; k < kNumScheduleKinds; ++k) {
      if (options.try_kind[k]) TrySchedule(t, order, static_cast<ScheduleKind>(k), limit, best);
    }
  }
  return best;
}

GroupSchedule SearchSchedule(const PipelineTimes& base, double limit, const SearchOptions& options) {
  return SearchSchedule(base, OrdersToSearch(base, options), limit, options);
}

}  // namespace dynapipe::planner
