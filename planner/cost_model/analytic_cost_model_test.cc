#include "planner/cost_model/analytic_cost_model.h"

#include <catch2/catch.hpp>

#include "planner/cost_model/pipeline_model.h"
#include "planner/testing/test_specs.h"

namespace dynapipe::planner {
namespace {

using Catch::Detail::Approx;

using testing::Gpt67b;
using testing::H100;

TEST_CASE("Analytic costs grow with size and length; attention makes length superlinear") {
  auto m = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  REQUIRE(m.ok());
  auto cost = [&](int mbs, int seq) { return *(*m)->Cost(LayerKind::kEncoder, Shape{mbs, seq, 0}, Recompute::kNone); };
  double prev = 0;
  for (int seq = 64; seq <= 8192; seq *= 2) {
    const LayerCost c = cost(1, seq);
    CHECK(c.fw_ms > prev);
    CHECK(c.bw_ms > c.fw_ms);
    prev = c.fw_ms;
  }
  CHECK(cost(2, 512).fw_ms > cost(1, 512).fw_ms);
  // Same tokens, longer rows: more attention work.
  CHECK(cost(1, 8192).fw_ms > 1.2 * cost(8, 1024).fw_ms);
  // Korthikanti et al.: 34 s b h + 5 a s^2 b bytes per layer without recomputation.
  CHECK(cost(1, 2048).stored_mb == Approx((34.0 * 2048 * 4096 + 5.0 * 32 * 2048 * 2048) / 1e6));
}

TEST_CASE("Varlen attention is priced by the pairs inside each sample, the GEMMs by the padded grid") {
  auto m = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  REQUIRE(m.ok());
  auto cost = [&](const Shape& s) { return *(*m)->Cost(LayerKind::kEncoder, s, Recompute::kNone); };
  const Shape grid{4, 2048, 0};
  // Four samples of 512 packed into each row: a quarter of the pairs.
  const Shape packed = WorkShape(grid, 16LL * 512 * 512, WorkModel{.varlen_attention = true});
  CHECK(packed.cells == 16LL * 512 * 512);
  CHECK(cost(packed).fw_ms < 0.9 * cost(grid).fw_ms);
  CHECK(cost(packed).stored_mb < cost(grid).stored_mb);
  // Attention is the only difference: a packed row of one-token samples costs the GEMMs alone.
  const Shape tiny = WorkShape(grid, 4LL * 2048, WorkModel{.varlen_attention = true});
  CHECK(cost(tiny).fw_ms > 0.3 * cost(grid).fw_ms);
  // Samples that fill their rows, or a kernel that masks after computing, price the grid.
  CHECK(WorkShape(grid, 4LL * 2048 * 2048, WorkModel{.varlen_attention = true}).padded());
  CHECK(WorkShape(grid, 16LL * 512 * 512, WorkModel{.varlen_attention = false}).padded());
  CHECK(WorkShape(Shape{4, 256, 128}, 100, WorkModel{.varlen_attention = true}).padded());  // encoder-decoder
}

TEST_CASE("Recomputation trades memory for backward time") {
  auto m = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  REQUIRE(m.ok());
  const Shape s{2, 4096, 0};
  auto none = *(*m)->Cost(LayerKind::kEncoder, s, Recompute::kNone);
  auto sel = *(*m)->Cost(LayerKind::kEncoder, s, Recompute::kSelective);
  auto full = *(*m)->Cost(LayerKind::kEncoder, s, Recompute::kFull);
  CHECK(none.stored_mb > sel.stored_mb);
  CHECK(sel.stored_mb > full.stored_mb);
  CHECK(full.stored_mb == Approx(2.0 * 4096 * 2 * 4096 / 1e6));
  CHECK(none.bw_ms < sel.bw_ms);
  CHECK(sel.bw_ms < full.bw_ms);
  CHECK(none.fw_ms == sel.fw_ms);
}

TEST_CASE("Parameter counts match the model size; model state per stage follows the memory model") {
  auto m = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  REQUIRE(m.ok());
  const double layer = (*m)->ParamsMillions(LayerKind::kEncoder);
  CHECK(layer == Approx(201.5).epsilon(0.01));  // 4h^2 + 2hf
  const double total = 32 * layer + (*m)->ParamsMillions(LayerKind::kEmbedding);
  CHECK(total / 1e3 == Approx(6.7).epsilon(0.03));
  MemoryOptions mem;
  mem.limit_mb = 80000;
  auto pm = PipelineModel::Create(Gpt67b(), 8, {}, std::shared_ptr<const LayerCostModel>(std::move(*m)), mem);
  REQUIRE(pm.ok());
  CHECK(pm->num_chunks() == 8);
  // Middle stage: 4 layers x 18 bytes per parameter (bf16 weights, fp32 grads, master, Adam moments).
  CHECK(pm->StaticMb(3) == Approx(4 * layer * 18).epsilon(1e-6));
  CHECK(pm->StaticMb(0) > pm->StaticMb(3));  // embedding
  mem.zero1 = true;
  mem.dp = 4;
  auto m2 = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  auto sharded = PipelineModel::Create(Gpt67b(), 8, {}, std::shared_ptr<const LayerCostModel>(std::move(*m2)), mem);
  // ZeRO-1 shards the moments; the fp32 master stays whole (as CudaGptStage keeps it).
  CHECK(sharded->StaticMb(3) == Approx(4 * layer * (2 + 4 + 4 + 8.0 / 4)).epsilon(1e-6));
}

TEST_CASE("A gated feed-forward (model.block.mlp) prices a third ffn x hidden matrix") {
  proto::ModelSpec gated = Gpt67b();
  gated.mutable_block()->set_mlp(proto::MlpKind::gated_gelu);
  auto plain = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  auto three = AnalyticCostModel::Create(gated, H100(), {});
  REQUIRE(plain.ok());
  REQUIRE(three.ok());
  const double h = 4096, f = 4 * 4096;
  CHECK(((*three)->ParamsMillions(LayerKind::kEncoder) - (*plain)->ParamsMillions(LayerKind::kEncoder)) * 1e6 ==
        Approx(h * f));
  const Shape s{4, 2048, 0};
  const LayerCost a = *(*plain)->Cost(LayerKind::kEncoder, s, Recompute::kNone);
  const LayerCost b = *(*three)->Cost(LayerKind::kEncoder, s, Recompute::kNone);
  CHECK(b.fw_ms > a.fw_ms);
  CHECK(b.stored_mb > a.stored_mb);
  // relu or gelu: the same two matrices.
  proto::ModelSpec relu = Gpt67b();
  relu.mutable_block()->set_mlp(proto::MlpKind::relu);
  auto two = AnalyticCostModel::Create(relu, H100(), {});
  REQUIRE(two.ok());
  CHECK((*two)->Cost(LayerKind::kEncoder, s, Recompute::kNone)->fw_ms == a.fw_ms);
}

TEST_CASE("Llama's block: SwiGLU prices three matrices, grouped-query heads shrink K and V, rotary has no table") {
  proto::ModelSpec llama = Gpt67b();
  llama.set_kind(proto::ModelKind::llama);
  llama.mutable_block()->set_mlp(proto::MlpKind::swiglu);
  llama.mutable_block()->set_positions(proto::PositionKind::rotary);
  proto::ModelSpec gated = Gpt67b();
  gated.mutable_block()->set_mlp(proto::MlpKind::gated_gelu);
  auto mha = AnalyticCostModel::Create(llama, H100(), {});
  auto three = AnalyticCostModel::Create(gated, H100(), {});
  llama.set_kv_heads(llama.heads() / 4);
  auto gqa = AnalyticCostModel::Create(llama, H100(), {});
  REQUIRE(mha.ok());
  REQUIRE(three.ok());
  REQUIRE(gqa.ok());
  const double h = 4096;
  const Shape s{4, 2048, 0};
  const LayerCost m = *(*mha)->Cost(LayerKind::kEncoder, s, Recompute::kNone);
  const LayerCost g = *(*gqa)->Cost(LayerKind::kEncoder, s, Recompute::kNone);
  // SwiGLU and gated GELU: the same matrices and activations.
  CHECK((*three)->Cost(LayerKind::kEncoder, s, Recompute::kNone)->fw_ms == m.fw_ms);
  CHECK((*mha)->ParamsMillions(LayerKind::kEncoder) == (*three)->ParamsMillions(LayerKind::kEncoder));
  // 8 of 32 kv heads: K and V are a quarter of their h x h each.
  CHECK(((*mha)->ParamsMillions(LayerKind::kEncoder) - (*gqa)->ParamsMillions(LayerKind::kEncoder)) * 1e6 ==
        Approx(2 * h * h * 0.75));
  CHECK(g.fw_ms < m.fw_ms);
  CHECK(g.stored_mb < m.stored_mb);
  CHECK((*mha)->ParamsMillions(LayerKind::kEmbedding) * 1e6 == Approx(llama.vocab() * h));
}

TEST_CASE("The LM head is priced on the rows it scores (Shape::scored), the layers on every token") {
  auto m = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  REQUIRE(m.ok());
  Shape s{4, 2048, 0};
  const LayerCost all = *(*m)->Cost(LayerKind::kPostprocess, s, Recompute::kNone);
  const LayerCost layer = *(*m)->Cost(LayerKind::kEncoder, s, Recompute::kNone);
  s.scored = 4 * 2048 / 25;  // FLAN-like: 4% of the tokens are targets
  const LayerCost part = *(*m)->Cost(LayerKind::kPostprocess, s, Recompute::kNone);
  CHECK(part.fw_ms < all.fw_ms / 10);
  CHECK(part.stored_mb == Approx(all.stored_mb * static_cast<double>(s.scored) / (4 * 2048)));
  CHECK((*m)->Cost(LayerKind::kEncoder, s, Recompute::kNone)->fw_ms == layer.fw_ms);
  s.scored = 4 * 2048;  // every token scored: the grid's price
  CHECK((*m)->Cost(LayerKind::kPostprocess, s, Recompute::kNone)->fw_ms == all.fw_ms);
}

TEST_CASE("Layouts: equal stages, explicit interleaving, and bad assignments") {
  auto m = AnalyticCostModel::Create(Gpt67b(), H100(), {});
  std::shared_ptr<const LayerCostModel> cost(std::move(*m));
  auto even = PipelineModel::Create(Gpt67b(), 5, {}, cost, {});  // 32 layers over 5: middle stages get the extra
  REQUIRE(even.ok());
  int total = 0;
  for (const auto& c : even->chunks()) total += c.num_encoder;
  CHECK(total == 32);
  CHECK(even->chunks().front().num_encoder == 6);
  std::vector<int> inter;
  for (int i = 0; i < 32; ++i) inter.push_back(i % 4);
  auto il = PipelineModel::Create(Gpt67b(), 4, inter, cost, {});
  REQUIRE(il.ok());
  CHECK(il->chunks_per_device() == 8);
  CHECK(il->interleaved());
  CHECK(PipelineModel::Create(Gpt67b(), 4, std::vector<int>(31, 0), cost, {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(PipelineModel::Create(Gpt67b(), 4, std::vector<int>(32, 0), cost, {}).status().code() ==
        absl::StatusCode::kInvalidArgument);  // devices 1..3 get nothing
}

}  // namespace
}  // namespace dynapipe::planner
