#include "runtime/model/profile.h"

#include <catch2/catch.hpp>

#include "planner/cost_model/profile_cost_model.h"

namespace dynapipe::runtime::model {
namespace {

using Catch::Detail::Approx;
using Catch::Matchers::Contains;

GptConfig Tiny() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.vocab = 16;
  c.max_positions = 64;
  return c;
}

const proto::LayerProfile* Find(const proto::CostProfile& p, proto::LayerProfile::Kind kind) {
  for (const auto& l : p.layers()) {
    if (l.kind() == kind) return &l;
  }
  return nullptr;
}

const proto::CostPoint* At(const proto::LayerProfile& l, int mbs, int seq) {
  for (const auto& p : l.points()) {
    if (p.mbs() == mbs && p.seq() == seq) return &p;
  }
  return nullptr;
}

TEST_CASE("Profile axes: seq about 1.5x apart ending at the maximum; mbs doubling up to the token cap") {
  CHECK(ProfileSeqAxis(8, 512) == std::vector<int>{8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512});
  CHECK(ProfileSeqAxis(8, 100) == std::vector<int>{8, 16, 24, 32, 48, 64, 96, 100});
  CHECK(ProfileSeqAxis(16, 16) == std::vector<int>{16});
  CHECK(ProfileMbsAxis(8, 64) == std::vector<int>{1, 2, 4, 8});
  CHECK(ProfileMbsAxis(128, 64) == std::vector<int>{1});
}

TEST_CASE("A measured profile covers every kind and loads into the planner's profile cost model") {
  ProfileOptions o;
  o.seq = {8, 16, 32};
  o.mbs = {1, 2, 4};
  o.max_tokens = 64;
  o.repetitions = 1;
  int calls = 0, last_total = 0;
  o.progress = [&](const std::string&, int, int total) {
    ++calls;
    last_total = total;
  };
  auto profile = ProfileGpt(Tiny(), o);
  REQUIRE(profile.ok());
  CHECK(calls == 3 * 8);  // (4, 32) is above max_tokens
  CHECK(last_total == 8);
  CHECK(profile->device() == "cpu");
  CHECK(profile->max_tokens() == 64);
  const auto* enc = Find(*profile, proto::LayerProfile::encoder);
  const auto* emb = Find(*profile, proto::LayerProfile::embedding);
  const auto* post = Find(*profile, proto::LayerProfile::postprocess);
  REQUIRE(enc != nullptr);
  REQUIRE(emb != nullptr);
  REQUIRE(post != nullptr);
  CHECK(enc->points_size() == 8);
  CHECK(At(*enc, 4, 32) == nullptr);
  // One layer: ln1 + qkv + proj + ln2 + fc + mlp proj, fp32.
  const int C = 16, F = 32;
  CHECK(enc->param_mb() == Approx((2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C + C * F + F + F * C + C) * 4 / 1e6));
  CHECK(emb->param_mb() == Approx((16 * C + 64 * C) * 4 / 1e6));
  for (const auto* l : {enc, emb, post}) {
    for (const auto& p : l->points()) {
      INFO(proto::LayerProfile::Kind_Name(l->kind()) << " mbs " << p.mbs() << " seq " << p.seq());
      CHECK(p.fw_ms() > 0);
      CHECK(p.bw_ms() > 0);
      // The embedding keeps only token ids (outside the pool) for backward.
      if (l != emb) CHECK(p.stored_activation_mb() > 0);
    }
  }
  // Stored activations are requested bytes: exactly linear in the rows.
  CHECK(At(*enc, 4, 16)->stored_activation_mb() == Approx(4 * At(*enc, 1, 16)->stored_activation_mb()));
  // Attention stores rows x heads x seq x seq probabilities: more than linear in seq.
  CHECK(At(*enc, 1, 32)->stored_activation_mb() > 2 * At(*enc, 1, 16)->stored_activation_mb());

  auto model = planner::ProfileCostModel::Create(*profile, 4);
  REQUIRE(model.ok());
  CHECK((*model)->Cost(planner::LayerKind::kEncoder, {2, 24, 0}, planner::Recompute::kNone).ok());
  CHECK((*model)->Cost(planner::LayerKind::kPostprocess, {1, 8, 0}, planner::Recompute::kNone).ok());
  CHECK((*model)->Cost(planner::LayerKind::kEncoder, {4, 32, 0}, planner::Recompute::kNone).status().code() ==
        absl::StatusCode::kOutOfRange);
}

TEST_CASE("Profile options are checked") {
  ProfileOptions o;
  o.seq = {8, 128};
  o.mbs = {1};
  CHECK_THAT(std::string(ProfileGpt(Tiny(), o).status().message()), Contains("128 exceeds the model's 64 positions"));
  o.seq = {16, 8};
  CHECK_THAT(std::string(ProfileGpt(Tiny(), o).status().message()), Contains("profile seq"));
  o.seq = {8};
  o.repetitions = 0;
  CHECK_THAT(std::string(ProfileGpt(Tiny(), o).status().message()), Contains("repetitions"));
  o.repetitions = 1;
  o.mbs = {16};
  o.max_tokens = 64;
  CHECK_THAT(std::string(ProfileGpt(Tiny(), o).status().message()), Contains("no grid point"));
}

}  // namespace
}  // namespace dynapipe::runtime::model
