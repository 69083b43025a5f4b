#include "planner/cost_model/profile_cost_model.h"

#include <catch2/catch.hpp>

#include "src/common/proto_io.h"

namespace dynapipe::planner {
namespace {

using Catch::Detail::Approx;
using Catch::Matchers::Contains;

proto::CostProfile Grid() {
  // encoder: fw = mbs * seq / 100 ms on a 2 x 2 grid; bilinear data, so
  // interpolation must reproduce it exactly inside the grid.
  proto::CostProfile p;
  const auto status = ParseJsonProto(R"({"device": "test", "model_kind": "gpt", "hidden": 1024, "heads": 16,
    "layers": [{"kind": "encoder", "param_mb": 24, "points": [
      {"mbs": 1, "seq": 512, "fw_ms": 5.12, "bw_ms": 10.24, "stored_activation_mb": 10, "peak_activation_mb": 20},
      {"mbs": 1, "seq": 1024, "fw_ms": 10.24, "bw_ms": 20.48, "stored_activation_mb": 20, "peak_activation_mb": 40},
      {"mbs": 4, "seq": 512, "fw_ms": 20.48, "bw_ms": 40.96, "stored_activation_mb": 40, "peak_activation_mb": 80},
      {"mbs": 4, "seq": 1024, "fw_ms": 40.96, "bw_ms": 81.92, "stored_activation_mb": 80, "peak_activation_mb": 160}]}]})",
                                     "profile", &p);
  REQUIRE(status.ok());
  return p;
}

TEST_CASE("Profile interpolation is exact at grid points and bilinear between them") {
  auto m = ProfileCostModel::Create(Grid());
  REQUIRE(m.ok());
  auto at = [&](int mbs, int seq) { return (*m)->Cost(LayerKind::kEncoder, Shape{mbs, seq, 0}, Recompute::kNone); };
  CHECK(at(1, 512)->fw_ms == Approx(5.12));
  CHECK(at(4, 1024)->bw_ms == Approx(81.92));
  CHECK(at(2, 768)->fw_ms == Approx(2 * 768 / 100.0));
  CHECK(at(3, 600)->stored_mb == Approx(10.0 * 3 * 600 / 512));
  CHECK((*m)->ParamsMillions(LayerKind::kEncoder) == Approx(12));
}

TEST_CASE("A varlen micro-batch is priced as the profiled grid with its tokens and attention pairs") {
  auto m = ProfileCostModel::Create(Grid());
  REQUIRE(m.ok());
  // Two rows of 1024 holding four samples of 512: 2048 tokens, 4 * 512^2
  // pairs, the work of the profiled point 4 x 512.
  Shape packed{2, 1024, 0};
  packed.cells = 4LL * 512 * 512;
  CHECK((*m)->Cost(LayerKind::kEncoder, packed, Recompute::kNone)->fw_ms == Approx(20.48));
  CHECK((*m)->Cost(LayerKind::kEncoder, packed, Recompute::kNone)->stored_mb == Approx(40));
  // Samples shorter than the shortest profiled length are priced at it.
  Shape shorts{1, 1024, 0};
  shorts.cells = 8LL * 128 * 128;
  CHECK((*m)->Cost(LayerKind::kEncoder, shorts, Recompute::kNone)->fw_ms == Approx(10.24));
  // Its work point lies above the profile (16 rows of 512 for 8 samples
  // filling 4 rows): priced as its grid, never refused.
  Shape wide{4, 1024, 0};
  wide.cells = 16LL * 256 * 256;
  auto priced = (*m)->Cost(LayerKind::kEncoder, wide, Recompute::kNone);
  REQUIRE(priced.ok());
  CHECK(priced->fw_ms == Approx(40.96));
}

TEST_CASE("The LM head of a micro-batch is priced on the rows it scores, in proportion to the profiled grid's") {
  proto::CostProfile p = Grid();
  proto::LayerProfile head = p.layers(0);
  head.set_kind(proto::LayerProfile::postprocess);
  *p.add_layers() = head;
  auto m = ProfileCostModel::Create(p);
  REQUIRE(m.ok());
  Shape s{4, 1024, 0};
  const LayerCost all = *(*m)->Cost(LayerKind::kPostprocess, s, Recompute::kNone);
  s.scored = 512;  // an eighth of the 4096 tokens
  const LayerCost part = *(*m)->Cost(LayerKind::kPostprocess, s, Recompute::kNone);
  CHECK(part.fw_ms == Approx(all.fw_ms / 8));
  CHECK(part.bw_ms == Approx(all.bw_ms / 8));
  CHECK(part.stored_mb == Approx(all.stored_mb / 8));
  // Layers are not the head: scored rows change nothing there.
  CHECK((*m)->Cost(LayerKind::kEncoder, s, Recompute::kNone)->fw_ms == Approx(40.96));
}

TEST_CASE("A query outside the profile is OUT_OF_RANGE with the profiled range, never extrapolated") {
  auto m = ProfileCostModel::Create(Grid());
  REQUIRE(m.ok());
  auto big = (*m)->Cost(LayerKind::kEncoder, Shape{8, 512, 0}, Recompute::kNone);
  CHECK(big.status().code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(big.status().message()), Contains("mbs 1..4") && Contains("seq 512..1024"));
  CHECK((*m)->Cost(LayerKind::kEncoder, Shape{1, 256, 0}, Recompute::kNone).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK((*m)->Cost(LayerKind::kPostprocess, Shape{1, 512, 0}, Recompute::kNone).status().code() ==
        absl::StatusCode::kOutOfRange);
}

TEST_CASE("A profile with max_tokens may leave out larger points; queries needing them are OUT_OF_RANGE") {
  proto::CostProfile p = Grid();
  p.mutable_layers(0)->mutable_points()->RemoveLast();  // mbs 4, seq 1024: 4096 tokens
  p.set_max_tokens(4096);
  CHECK_THAT(std::string(ProfileCostModel::Create(p).status().message()),
             Contains("no point at mbs 4, seq 1024 (4096 tokens, within max_tokens 4096)"));
  p.set_max_tokens(2048);
  auto m = ProfileCostModel::Create(p);
  REQUIRE(m.ok());
  auto at = [&](int mbs, int seq) { return (*m)->Cost(LayerKind::kEncoder, Shape{mbs, seq, 0}, Recompute::kNone); };
  CHECK(at(1, 768)->fw_ms == Approx(7.68));  // its corners are measured
  CHECK(at(4, 512)->fw_ms == Approx(20.48));
  for (const auto& [mbs, seq] : {std::pair{4, 1024}, std::pair{2, 768}}) {
    auto c = at(mbs, seq);
    CHECK(c.status().code() == absl::StatusCode::kOutOfRange);
    CHECK_THAT(std::string(c.status().message()), Contains("needs the point at mbs 4, seq 1024") &&
                                                      Contains("max_tokens 2048"));
  }
}

TEST_CASE("Full recomputation keeps only the layer input and re-runs the forward") {
  auto m = ProfileCostModel::Create(Grid());
  REQUIRE(m.ok());
  auto none = (*m)->Cost(LayerKind::kEncoder, Shape{4, 1024, 0}, Recompute::kNone);
  auto full = (*m)->Cost(LayerKind::kEncoder, Shape{4, 1024, 0}, Recompute::kFull);
  CHECK(full->stored_mb == Approx(4.0 * 1024 * 1024 * 2 / 1e6));
  CHECK(full->bw_ms == Approx(none->bw_ms + none->fw_ms));
}

TEST_CASE("Malformed profiles are rejected with the layer and point named") {
  proto::CostProfile p = Grid();
  p.mutable_layers(0)->mutable_points()->RemoveLast();
  CHECK_THAT(std::string(ProfileCostModel::Create(p).status().message()), Contains("layers[0].points: not a complete grid"));
  p = Grid();
  p.mutable_layers(0)->mutable_points(2)->set_fw_ms(-1);
  CHECK_THAT(std::string(ProfileCostModel::Create(p).status().message()), Contains("layers[0].points[2]"));
  p = Grid();
  *p.add_layers() = p.layers(0);
  CHECK_THAT(std::string(ProfileCostModel::Create(p).status().message()), Contains("appears twice"));
}

}  // namespace
}  // namespace dynapipe::planner
