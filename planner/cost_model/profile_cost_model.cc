#include "planner/cost_model/profile_cost_model.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner {
namespace {

absl::StatusOr<LayerKind> KindOf(proto::LayerProfile::Kind kind, int index) {
  switch (kind) {
    case proto::LayerProfile::embedding: return LayerKind::kEmbedding;
    case proto::LayerProfile::encoder: return LayerKind::kEncoder;
    case proto::LayerProfile::decoder: return LayerKind::kDecoder;
    case proto::LayerProfile::postprocess: return LayerKind::kPostprocess;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("layers[", index, "].kind: must be set"));
}

std::vector<int> Axis(const proto::LayerProfile& layer, int (proto::CostPoint::*get)() const) {
  std::vector<int> v;
  for (const auto& p : layer.points()) v.push_back((p.*get)());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Index i and weight w such that x lies in [axis[i], axis[i+1]] with
// x = (1-w)*axis[i] + w*axis[i+1]; false if x is outside the axis.
bool Locate(const std::vector<int>& axis, double x, int* i, double* w) {
  if (axis.size() == 1) {
    *i = 0;
    *w = 0;
    return x == axis[0];
  }
  if (x < axis.front() || x > axis.back()) return false;
  const auto it = std::upper_bound(axis.begin(), axis.end(), x);
  int hi = static_cast<int>(it - axis.begin());
  if (hi == static_cast<int>(axis.size())) hi = static_cast<int>(axis.size()) - 1;
  *i = hi - 1;
  *w = (x - axis[*i]) / (axis[hi] - axis[*i]);
  return true;
}

std::string Range(const std::vector<int>& axis) {
  return axis.size() == 1 ? absl::StrCat(axis[0]) : absl::StrCat(axis.front(), "..", axis.back());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProfileCostModel>> ProfileCostModel::Create(const proto::CostProfile& profile,
                                                                           int bytes_per_element) {
  std::unique_ptr<ProfileCostModel> model(new ProfileCostModel());
  model->device_ = profile.device();
  model->hidden_ = profile.hidden();
  model->bytes_per_element_ = bytes_per_element;
  if (profile.hidden() <= 0) return absl::InvalidArgumentError("hidden: must be positive");
  if (profile.max_tokens() < 0) return absl::InvalidArgumentError("max_tokens: negative");
  model->max_tokens_ = profile.max_tokens();
  for (int li = 0; li < profile.layers_size(); ++li) {
    const auto& layer = profile.layers(li);
    const std::string where = absl::StrCat("layers[", li, "]");
    auto kind = KindOf(layer.kind(), li);
    if (!kind.ok()) return kind.status();
    Grid& g = model->grids_[static_cast<int>(*kind)];
    if (g.present) return absl::InvalidArgumentError(absl::StrCat(where, ": kind ", LayerKindName(*kind), " appears twice"));
    if (layer.param_mb() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ".param_mb: negative"));
    if (layer.points_size() == 0) return absl::InvalidArgumentError(absl::StrCat(where, ".points: empty"));
    g.present = true;
    g.params_millions = layer.param_mb() / bytes_per_element;
    g.mbs = Axis(layer, &proto::CostPoint::mbs);
    g.seq = Axis(layer, &proto::CostPoint::seq);
    g.dec = Axis(layer, &proto::CostPoint::dec_seq);
    const size_t cells = g.mbs.size() * g.seq.size() * g.dec.size();
    g.values.assign(cells, LayerCost{});
    std::vector<bool>& seen = g.measured;
    seen.assign(cells, false);
    for (int pi = 0; pi < layer.points_size(); ++pi) {
      const auto& p = layer.points(pi);
      const std::string pw = absl::StrCat(where, ".points[", pi, "]");
      if (p.mbs() <= 0 || p.seq() <= 0 || p.dec_seq() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(pw, ": mbs and seq must be positive"));
      }
      if (!(p.fw_ms() >= 0) || !(p.bw_ms() >= 0) || !(p.stored_activation_mb() >= 0) ||
          !(p.peak_activation_mb() >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(pw, ": times and memory must be non-negative numbers"));
      }
      const size_t mi = std::lower_bound(g.mbs.begin(), g.mbs.end(), p.mbs()) - g.mbs.begin();
      const size_t si = std::lower_bound(g.seq.begin(), g.seq.end(), p.seq()) - g.seq.begin();
      const size_t di = std::lower_bound(g.dec.begin(), g.dec.end(), p.dec_seq()) - g.dec.begin();
      const size_t cell = (mi * g.seq.size() + si) * g.dec.size() + di;
      if (seen[cell]) {
        return absl::InvalidArgumentError(absl::StrCat(pw, ": duplicate point (mbs ", p.mbs(), ", seq ", p.seq(),
                                                       ", dec_seq ", p.dec_seq(), ")"));
      }
      seen[cell] = true;
      g.values[cell] = {p.fw_ms(), p.bw_ms(), p.stored_activation_mb(), p.peak_activation_mb()};
    }
    for (size_t mi = 0; mi < g.mbs.size(); ++mi) {
      for (size_t si = 0; si < g.seq.size(); ++si) {
        for (size_t di = 0; di < g.dec.size(); ++di) {
          if (seen[(mi * g.seq.size() + si) * g.dec.size() + di]) continue;
          const int64_t tokens = static_cast<int64_t>(g.mbs[mi]) * (g.seq[si] + g.dec[di]);
          if (model->max_tokens_ > 0 && tokens > model->max_tokens_) continue;
          return absl::InvalidArgumentError(absl::StrCat(
              where, ".points: not a complete grid: no point at mbs ", g.mbs[mi], ", seq ", g.seq[si],
              g.dec.size() > 1 ? absl::StrCat(", dec_seq ", g.dec[di]) : "",
              model->max_tokens_ > 0 ? absl::StrCat(" (", tokens, " tokens, within max_tokens ", model->max_tokens_, ")")
                                     : ""));
        }
      }
    }
  }
  return model;
}

absl::StatusOr<LayerCost> ProfileCostModel::Cost(LayerKind kind, const Shape& shape, Recompute r) const {
  const Grid& g = GridFor(kind);
  if (!g.present) {
    return absl::OutOfRangeError(absl::StrCat("profile ", device_, " has no ", LayerKindName(kind), " layer"));
  }
  // A varlen micro-batch, whose attention computes fewer pairs than its
  // grid, is priced as the grid with the same tokens T and attention cells
  // A: T^2 / A rows of A / T tokens (decoder-only shapes). Samples shorter
  // than the shortest profiled length are priced at it (slightly more
  // attention than they compute). Where that point needs a profile point
  // that was not measured (more rows than any measured at that length), the
  // micro-batch is priced as its whole grid, which costs at least as much.
  if (kind == LayerKind::kPostprocess && shape.scored > 0) {
    // Profiled with every row scored: the head costs in proportion to the
    // rows it computes.
    Shape grid = shape;
    grid.scored = 0;
    ASSIGN_OR_RETURN(LayerCost c, Cost(kind, grid, r));
    const double f = shape.head_tokens() / grid.head_tokens();
    return LayerCost{c.fw_ms * f, c.bw_ms * f, c.stored_mb * f, c.peak_mb * f};
  }
  if (!shape.padded() && shape.dec_seq == 0) {
    const double t = static_cast<double>(shape.mbs) * shape.seq, cells = shape.work_cells();
    const double seq = std::max<double>(cells / t, g.seq.front());
    absl::StatusOr<LayerCost> work = At(kind, shape, std::max<double>(t / seq, g.mbs.front()), seq, r);
    if (work.ok() || !absl::IsOutOfRange(work.status())) return work;
  }
  return At(kind, shape, shape.mbs, shape.seq, r);
}

absl::StatusOr<LayerCost> ProfileCostModel::At(LayerKind kind, const Shape& shape, double mbs, double seq,
                                               Recompute r) const {
  const Grid& g = GridFor(kind);
  int mi, si, di;
  double mw, sw, dw;
  const int dec = g.dec.size() == 1 && g.dec[0] == 0 ? 0 : shape.dec_seq;
  if (!Locate(g.mbs, mbs, &mi, &mw) || !Locate(g.seq, seq, &si, &sw) || !Locate(g.dec, dec, &di, &dw)) {
    return absl::OutOfRangeError(absl::StrCat(
        "out of profile: ", LayerKindName(kind), " layer at mbs ", mbs, ", seq ", seq,
        dec ? absl::StrCat(", dec_seq ", dec) : "", "; profiled mbs ", Range(g.mbs), ", seq ", Range(g.seq),
        g.dec.size() > 1 ? absl::StrCat(", dec_seq ", Range(g.dec)) : ""));
  }
  LayerCost out;
  const size_t ns = g.seq.size(), nd = g.dec.size();
  for (int a = 0; a < 2; ++a) {
    const double wa = a ? mw : 1 - mw;
    if (wa == 0) continue;
    for (int b = 0; b < 2; ++b) {
      const double wb = b ? sw : 1 - sw;
      if (wb == 0) continue;
      for (int c = 0; c < 2; ++c) {
        const double wc = c ? dw : 1 - dw;
        if (wc == 0) continue;
        const size_t cell = ((mi + a) * ns + (si + b)) * nd + (di + c);
        if (!g.measured[cell]) {
          return absl::OutOfRangeError(absl::StrCat(
              "out of profile: ", LayerKindName(kind), " layer at mbs ", mbs, ", seq ", seq,
              " needs the point at mbs ", g.mbs[mi + a], ", seq ", g.seq[si + b],
              ", above the profile's max_tokens ", max_tokens_));
        }
        const LayerCost& v = g.values[cell];
        const double w = wa * wb * wc;
        out.fw_ms += w * v.fw_ms;
        out.bw_ms += w * v.bw_ms;
        out.stored_mb += w * v.stored_mb;
        out.peak_mb += w * v.peak_mb;
      }
    }
  }
  if (r == Recompute::kFull && (kind == LayerKind::kEncoder || kind == LayerKind::kDecoder)) {
    const double input_mb =
        static_cast<double>(shape.mbs) * (shape.seq + shape.dec_seq) * hidden_ * bytes_per_element_ / 1e6;
    // The recomputed forward needs the activations again, transiently.
    out.peak_mb += out.stored_mb;
    out.stored_mb = std::min(out.stored_mb, input_mb);
    out.bw_ms += out.fw_ms;
  }
  return out;
}

double ProfileCostModel::ParamsMillions(LayerKind kind) const { return GridFor(kind).params_millions; }

std::string ProfileCostModel::Describe() const { return absl::StrCat("profile ", device_); }

}  // namespace dynapipe::planner
