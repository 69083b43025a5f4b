#pragma once

// Cost model from a measured CostProfile: multilinear interpolation over the
// profiled (mbs, seq[, dec_seq]) grid of each layer kind. A query outside the
// grid, or needing a point left out above the profile's max_tokens, is
// OUT_OF_RANGE (never extrapolated).

#include <array>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model/layer_cost.h"
#include "proto/cost_profile.pb.h"

namespace dynapipe::planner {

class ProfileCostModel : public LayerCostModel {
 public:
  // Validates the profile (known kinds, a complete grid per kind, positive
  // times and memory). INVALID_ARGUMENT names the layer and the bad point.
  // `bytes_per_element` sizes the layer input kept under full recomputation.
  static absl::StatusOr<std::unique_ptr<ProfileCostModel>> Create(const proto::CostProfile& profile,
                                                                  int bytes_per_element = 2);

  // kSelective needs a per-op breakdown the profile does not have; it is
  // answered as kNone (same memory, same time).
  absl::StatusOr<LayerCost> Cost(LayerKind kind, const Shape& shape, Recompute r) const override;
  double ParamsMillions(LayerKind kind) const override;
  std::string Describe() const override;
  bool MeasuredShape() const override { return true; }

 private:
  struct Grid {
    bool present = false;
    double params_millions = 0;
    std::vector<int> mbs, seq, dec;  // sorted axes; dec = {0} when not profiled
    std::vector<LayerCost> values;   // [mbs][seq][dec] row-major
    std::vector<bool> measured;      // same layout; false only above max_tokens
  };
  ProfileCostModel() = default;
  // Interpolated at (mbs, seq) for `shape` (its dec_seq, and its grid for
  // the layer input that full recomputation keeps).
  absl::StatusOr<LayerCost> At(LayerKind kind, const Shape& shape, double mbs, double seq, Recompute r) const;
  const Grid& GridFor(LayerKind kind) const { return grids_[static_cast<int>(kind)]; }

  std::array<Grid, 4> grids_;
  std::string device_;
  int hidden_ = 0;
  int bytes_per_element_ = 2;
  int64_t max_tokens_ = 0;  // 0: complete grids
};

}  // namespace dynapipe::planner
