// The CUDA GPT stage with a Llama-style block (RMS norm with Llama's
// epsilon, SwiGLU, no biases, rotary positions, grouped-query attention, an
// untied head) against the CPU GptStage (fp32) on the same bf16-rounded
// weights: one forward + backward on padded and packed micro-batches
// (positions restarting per sample) with the tiled attention and cuDNN's,
// a two-stage split whose second stage rotates with the batch's positions
// too, recomputation and inference. Cases that need a device are tagged [gpu].

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "runtime/kernels/cuda/test_util.h"
#include "runtime/model/cuda_stage_test_util.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_cuda.h"
#include "runtime/model/gpt_cuda_test_util.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::model {
namespace {

using cuda::testing::RelativeError;
using testing::CheckOneStep;
using testing::CpuStage;
using testing::FirstHalf;
using testing::Gpu;
using testing::PackedBatch;
using testing::PaddedBatch;
using testing::SecondHalf;
using testing::Slice;
using testing::WholeModel;

// Head dimension 32, four query heads reading two kv heads.
GptConfig LlamaConfig() {
  return {.num_layers = 2,
          .hidden = 128,
          .heads = 4,
          .ffn = 256,
          .vocab = 97,
          .max_positions = 64,
          .tie_embeddings = false,
          .norm = NormKind::kRms,
          .mlp = MlpKind::kSwiglu,
          .bias = false,
          .norm_eps = 1e-5,
          .kv_heads = 2,
          .rotary = true};
}

TEST_CASE("CPU reference: the Llama block's layout has no position table and a grouped qkv projection") {
  const GptConfig config = LlamaConfig();
  auto layout = GptLayout::Make(config, WholeModel());
  REQUIRE_OK(layout.status());
  CHECK(layout->wpe() == GptLayout::kAbsent);
  CHECK(layout->FindParam("wpe") == nullptr);
  const ParamInfo* qkv = layout->FindParam("h.0.attn.qkv.w");
  REQUIRE(qkv != nullptr);
  CHECK(qkv->shape == std::vector<int64_t>{128 + 2 * 2 * 32, 128});
  CHECK(layout->FindParam("h.0.attn.qkv.b") == nullptr);
}

TEST_CASE("a Llama-style CUDA stage matches the CPU stage on padded and packed batches", "[gpu]") {
  for (const int kv_heads : {2, 1, 4}) {  // grouped, one kv head, every head its own
    GptConfig config = LlamaConfig();
    config.kv_heads = kv_heads;
    INFO("kv heads " << kv_heads);
    CheckOneStep(config, PackedBatch(config.vocab));
    CheckOneStep(config, PaddedBatch(config.vocab));
  }
  GptConfig materialized = LlamaConfig();
  materialized.attention = AttentionKernel::kMaterialized;
  CheckOneStep(materialized, PackedBatch(materialized.vocab));
}

TEST_CASE("a Llama-style CUDA stage with cuDNN's fused attention matches the CPU stage", "[gpu]") {
  CheckOneStep(LlamaConfig(), PackedBatch(LlamaConfig().vocab), /*cudnn_attention=*/true);
  CheckOneStep(LlamaConfig(), PaddedBatch(LlamaConfig().vocab), /*cudnn_attention=*/true);
}

TEST_CASE("Llama-style CUDA stages chained through device buffers match the CPU's whole model", "[gpu]") {
  const GptConfig config = LlamaConfig();
  const TokenBatch batch = PackedBatch(config.vocab);
  const float scale = 1.0f / static_cast<float>(batch.loss_tokens);
  BufferPool cpu_pool(CpuAllocator());
  std::unique_ptr<GptStage> cpu = CpuStage(config, WholeModel(), &cpu_pool);
  auto cpu_loss = cpu->ForwardLoss(0, batch, nullptr, nullptr, scale, Recompute::kNone);
  REQUIRE_OK(cpu_loss.status());
  REQUIRE_OK(cpu->Backward(0, nullptr, nullptr));

  Gpu gpu;
  std::unique_ptr<CudaGptStage> s0 = gpu.Stage(config, FirstHalf());
  std::unique_ptr<CudaGptStage> s1 = gpu.Stage(config, SecondHalf());
  CHECK_FALSE(s0->HasSharedEmbedding());  // untied: wte on the first stage, the head on the last
  const int64_t H = s0->HiddenElements(batch);
  Buffer h = gpu.Bf16(H), dh = gpu.Bf16(H);
  REQUIRE_OK(s0->ForwardLoss(0, batch, nullptr, h.data(), scale, Recompute::kNone).status());
  auto loss = s1->ForwardLoss(0, batch, h.data(), nullptr, scale, Recompute::kNone);
  REQUIRE_OK(loss.status());
  INFO("cpu loss " << *cpu_loss << " gpu loss " << *loss);
  CHECK(std::abs(*loss - *cpu_loss) <= 1e-2 * *cpu_loss);
  REQUIRE_OK(s1->Backward(0, nullptr, dh.data()));
  REQUIRE_OK(s0->Backward(0, dh.data(), nullptr));
  // Every parameter lives on exactly one stage: each gradient against the CPU's.
  int compared = 0;
  for (CudaGptStage* st : {s0.get(), s1.get()}) {
    const std::vector<float> grads = gpu.Grads(*st);
    for (const ParamInfo& p : st->layout().params()) {
      const ParamInfo* q = cpu->FindParam(p.name);
      REQUIRE(q != nullptr);
      INFO(p.name);
      CHECK(RelativeError(Slice(grads, p), Slice(cpu->grad_data(), *q)) <= 1e-2);
      ++compared;
    }
  }
  CHECK(compared == static_cast<int>(cpu->layout().params().size()));
}

// The same kernels on the same values: recomputation (which rotates and
// expands the kv heads again) gives the same loss bits and gradients.
TEST_CASE("a Llama-style CUDA stage recomputes to kNone's loss and gradients", "[gpu]") {
  const GptConfig config = LlamaConfig();
  const TokenBatch batch = PackedBatch(config.vocab);
  const float scale = 1.0f / static_cast<float>(batch.loss_tokens);
  Gpu gpu;
  std::unique_ptr<CudaGptStage> stage = gpu.Stage(config, WholeModel());
  auto run = [&](int mb, Recompute r, double* loss) {
    REQUIRE_OK(stage->ZeroGrads());
    auto l = stage->ForwardLoss(mb, batch, nullptr, nullptr, scale, r);
    REQUIRE_OK(l.status());
    *loss = *l;
    REQUIRE_OK(stage->Backward(mb, nullptr, nullptr));
    return gpu.Grads(*stage);
  };
  double loss_none = 0, loss_full = 0, loss_selective = 0;
  const std::vector<float> none = run(0, Recompute::kNone, &loss_none);
  const std::vector<float> full = run(1, Recompute::kFull, &loss_full);
  const std::vector<float> selective = run(2, Recompute::kSelective, &loss_selective);
  CHECK(loss_full == loss_none);
  CHECK(loss_selective == loss_none);
  for (const ParamInfo& p : stage->layout().params()) {
    INFO(p.name);
    CHECK(RelativeError(Slice(full, p), Slice(none, p)) <= 1e-5);
    CHECK(RelativeError(Slice(selective, p), Slice(none, p)) <= 1e-5);
  }
}

TEST_CASE("Infer: a Llama-style stage's logits match the CPU's; a split chains to the whole model's", "[gpu]") {
  const GptConfig config = LlamaConfig();
  const TokenBatch batch = PackedBatch(config.vocab);
  const int64_t N = batch.rows * batch.seq, V = config.vocab;
  BufferPool cpu_pool(CpuAllocator());
  std::unique_ptr<GptStage> cpu = CpuStage(config, WholeModel(), &cpu_pool);
  std::vector<float> want(N * V);
  REQUIRE_OK(cpu->Infer(batch, nullptr, want.data()));

  Gpu gpu;
  std::unique_ptr<CudaGptStage> whole = gpu.Stage(config, WholeModel());
  Buffer logits = gpu.Bf16(N * V);
  REQUIRE_OK(whole->Infer(batch, nullptr, logits.data()));
  const std::vector<float> got = gpu.Download(logits, N * V);
  CHECK(RelativeError(got, want) <= 1e-2);

  std::unique_ptr<CudaGptStage> s0 = gpu.Stage(config, FirstHalf());
  std::unique_ptr<CudaGptStage> s1 = gpu.Stage(config, SecondHalf());
  Buffer h = gpu.Bf16(s0->HiddenElements(batch)), split = gpu.Bf16(N * V);
  REQUIRE_OK(s0->Infer(batch, nullptr, h.data()));
  REQUIRE_OK(s1->Infer(batch, h.data(), split.data()));
  CHECK(RelativeError(gpu.Download(split, N * V), got) <= 1e-6);
}

TEST_CASE("CudaGptStage::Create refuses kv heads that do not divide the heads, before touching the device") {
  BufferPool pool(CpuAllocator());  // never used: the check comes first
  GptConfig c = LlamaConfig();
  c.kv_heads = 3;
  auto s = CudaGptStage::Create(c, WholeModel(), nullptr, &pool);
  CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.status().message().find("model.kv_heads") != absl::string_view::npos);
}

}  // namespace
}  // namespace dynapipe::runtime::model
