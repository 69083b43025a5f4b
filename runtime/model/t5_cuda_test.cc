// The CUDA T5 stage against the CPU T5Stage (fp32, the reference; its
// arithmetic is checked against PyTorch in tests/golden) on the same
// bf16-rounded weights, both driven through the Stage interface: one
// forward + backward of padded and packed encoder-decoder micro-batches
// (the loss and every parameter's gradient, the relative bias tables and
// the cross-attention included), splits with the encoder/decoder boundary
// inside a stage and between stages, chained through device buffers,
// recomputation, inference, and a short AdamW run that learns. Device cases
// are tagged [gpu].

#include "runtime/model/t5_cuda.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "runtime/kernels/cuda/device_memory.h"
#include "runtime/kernels/cuda/test_util.h"
#include "runtime/model/cuda_stage_test_util.h"
#include "runtime/model/t5.h"
#include "runtime/optim/adamw.h"

namespace dynapipe::runtime::model {
namespace {

using cuda::testing::RelativeError;
using testing::RoundParams;
using testing::Slice;
using bf16 = __nv_bfloat16;

constexpr uint64_t kSeed = 5;
constexpr int kLayers = 4;  // 2 encoder + 2 decoder

// T5 v1.1's block (RMS norm, gated GELU, no biases), head dimension 32, tied
// embeddings (the head scaled by hidden^-0.5).
GptConfig T5Config() {
  GptConfig c;
  c.encoder_decoder = true;
  c.num_layers = 2;
  c.decoder_layers = 2;
  c.hidden = 64;
  c.heads = 2;
  c.ffn = 128;
  c.vocab = 97;
  c.max_positions = 64;
  c.norm = NormKind::kRms;
  c.mlp = MlpKind::kGatedGelu;
  c.bias = false;
  c.relative_buckets = 32;
  c.relative_max_distance = 128;
  return c;
}

// A sample: `input` encoder tokens and `target` decoder tokens in `row`,
// each placed after the row's earlier samples in its grid (as BuildTokenBatch
// packs them): the decoder reads [0] + target[:-1] and scores every target.
struct Sample {
  int row, input, target;
};

TokenBatch T5Batch(int rows, int enc_seq, int seq, const std::vector<Sample>& samples, uint64_t seed, int vocab) {
  TokenBatch b;
  b.rows = rows;
  b.seq = seq;
  b.enc_seq = enc_seq;
  b.enc_tokens.assign(rows * enc_seq, 0);
  b.enc_segments.assign(rows * enc_seq, -1);
  b.tokens.assign(rows * seq, 0);
  b.positions.assign(rows * seq, 0);
  b.segments.assign(rows * seq, -1);
  b.targets.assign(rows * seq, -1);
  std::vector<int> enc_at(rows, 0), dec_at(rows, 0), next(rows, 0);
  std::mt19937_64 rng(seed);
  for (const Sample& s : samples) {
    const int seg = next[s.row]++;
    REQUIRE(enc_at[s.row] + s.input <= enc_seq);
    REQUIRE(dec_at[s.row] + s.target <= seq);
    // The target follows a fixed rule from the input's first token, so the
    // model can learn it.
    const int32_t first = 1 + static_cast<int32_t>(rng() % (vocab - 1));
    for (int k = 0; k < s.input; ++k) {
      const size_t i = static_cast<size_t>(s.row) * enc_seq + enc_at[s.row] + k;
      b.enc_tokens[i] = k == 0 ? first : 1 + static_cast<int32_t>(rng() % (vocab - 1));
      b.enc_segments[i] = seg;
    }
    int32_t prev = 0, tok = (5 * first + 3) % vocab;
    for (int k = 0; k < s.target; ++k) {
      const size_t i = static_cast<size_t>(s.row) * seq + dec_at[s.row] + k;
      b.tokens[i] = prev;
      b.positions[i] = k;
      b.segments[i] = seg;
      b.targets[i] = tok;
      prev = tok;
      tok = (3 * tok + 1) % vocab;
    }
    enc_at[s.row] += s.input;
    dec_at[s.row] += s.target;
    b.loss_tokens += s.target;
    b.real_tokens += s.input + s.target;
  }
  return b;
}

// One sample per row, padded in both grids; and a row of padding only.
TokenBatch Padded(int vocab) { return T5Batch(3, 21, 13, {{0, 21, 9}, {1, 7, 13}}, 11, vocab); }
// Samples back to back, several per row, inputs and targets of other lengths.
TokenBatch Packed(int vocab) {
  return T5Batch(2, 40, 30, {{0, 12, 5}, {0, 20, 17}, {0, 8, 8}, {1, 33, 11}, {1, 7, 19}}, 12, vocab);
}

struct Gpu : testing::TestGpu {
  std::unique_ptr<CudaT5Stage> Stage(const GptConfig& config, const StageOptions& options) {
    auto s = CudaT5Stage::Create(config, options, stream.get(), &pool);
    REQUIRE_OK(s.status());
    RoundParams(**s);
    return std::move(*s);
  }
};

// The model split at layer `cut` (0 or kLayers: whole), one micro-batch
// forward and backward: the loss and each stage's gradients.
struct Run {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per stage, its layout's order
  std::vector<GptLayout> layouts;
};

std::vector<StageOptions> Split(int cut) {
  if (cut <= 0 || cut >= kLayers) return {StageOptions{0, kLayers, true, true, kSeed}};
  return {StageOptions{0, cut, true, false, kSeed}, StageOptions{cut, kLayers - cut, false, true, kSeed}};
}

Run CpuRun(const GptConfig& config, const TokenBatch& batch, int cut) {
  BufferPool pool(CpuAllocator());
  std::vector<std::unique_ptr<T5Stage>> st;
  for (const StageOptions& o : Split(cut)) {
    auto s = T5Stage::Create(config, o, &pool);
    REQUIRE_OK(s.status());
    RoundParams(**s);
    st.push_back(std::move(*s));
  }
  const float scale = 1.0f / static_cast<float>(batch.loss_tokens);
  Run r;
  if (st.size() == 1) {
    auto loss = st[0]->ForwardLoss(0, batch, nullptr, nullptr, scale);
    REQUIRE_OK(loss.status());
    r.loss = *loss;
    REQUIRE_OK(st[0]->Backward(0, nullptr, nullptr));
  } else {
    std::vector<float> mid(st[0]->OutputBytes(batch) / sizeof(float)), dmid(mid.size());
    REQUIRE_OK(st[0]->Forward(0, batch, nullptr, mid.data(), scale, Recompute::kNone));
    auto loss = st[1]->ForwardLoss(0, batch, mid.data(), nullptr, scale);
    REQUIRE_OK(loss.status());
    r.loss = *loss;
    REQUIRE_OK(st[1]->Backward(0, nullptr, dmid.data()));
    REQUIRE_OK(st[0]->Backward(0, dmid.data(), nullptr));
  }
  for (auto& s : st) {
    r.grads.emplace_back(s->grad_data().begin(), s->grad_data().end());
    r.layouts.push_back(s->layout());
  }
  return r;
}

Run GpuRun(Gpu& gpu, const GptConfig& config, const TokenBatch& batch, int cut, Recompute recompute) {
  std::vector<std::unique_ptr<CudaT5Stage>> st;
  for (const StageOptions& o : Split(cut)) st.push_back(gpu.Stage(config, o));
  const float scale = 1.0f / static_cast<float>(batch.loss_tokens);
  Run r;
  if (st.size() == 1) {
    auto loss = st[0]->ForwardLoss(0, batch, nullptr, nullptr, scale, recompute);
    REQUIRE_OK(loss.status());
    r.loss = *loss;
    REQUIRE_OK(st[0]->Backward(0, nullptr, nullptr));
  } else {
    const size_t bytes = st[0]->OutputBytes(batch);
    REQUIRE(bytes == st[1]->InputBytes(batch));
    Buffer mid = gpu.Bytes(bytes), dmid = gpu.Bytes(bytes);
    REQUIRE_OK(st[0]->Forward(0, batch, nullptr, mid.data(), scale, recompute));
    auto loss = st[1]->ForwardLoss(0, batch, mid.data(), nullptr, scale, recompute);
    REQUIRE_OK(loss.status());
    r.loss = *loss;
    REQUIRE_OK(st[1]->Backward(0, nullptr, dmid.data()));
    REQUIRE_OK(st[0]->Backward(0, dmid.data(), nullptr));
  }
  for (auto& s : st) {
    CHECK(s->in_flight() == 0);
    r.grads.push_back(gpu.Grads(*s));
    r.layouts.push_back(s->layout());
  }
  return r;
}

// The device's loss within 1% of the CPU's, each tensor's gradient within
// `tolerance` (relative L2; ReLU's flips need more, as in gpt_cuda_test).
void Compare(const Run& gpu, const Run& cpu, double tolerance) {
  INFO("cpu loss " << cpu.loss << ", gpu loss " << gpu.loss);
  REQUIRE(cpu.loss > 1.0);  // ~ln(97) at initialisation: not vacuous
  CHECK(std::abs(gpu.loss - cpu.loss) <= 1e-2 * cpu.loss);
  REQUIRE(gpu.grads.size() == cpu.grads.size());
  for (size_t k = 0; k < cpu.grads.size(); ++k) {
    for (const ParamInfo& p : cpu.layouts[k].params()) {
      INFO("stage " << k << ": " << p.name);
      CHECK(RelativeError(Slice(gpu.grads[k], p), Slice(cpu.grads[k], p)) <= tolerance);
    }
  }
}

TEST_CASE("CUDA T5 stage matches the CPU on padded and packed batches: loss and every gradient", "[gpu]") {
  const GptConfig config = T5Config();
  Gpu gpu;
  for (const TokenBatch& batch : {Padded(config.vocab), Packed(config.vocab)}) {
    Compare(GpuRun(gpu, config, batch, 0, Recompute::kNone), CpuRun(config, batch, 0), 3e-2);
  }
  GptConfig materialized = config;
  materialized.attention = AttentionKernel::kMaterialized;
  Compare(GpuRun(gpu, materialized, Packed(config.vocab), 0, Recompute::kNone), CpuRun(config, Packed(config.vocab), 0),
          3e-2);
  GptConfig relu = config;  // T5 v1.0's block, an untied head
  relu.mlp = MlpKind::kRelu;
  relu.tie_embeddings = false;
  Compare(GpuRun(gpu, relu, Packed(relu.vocab), 0, Recompute::kNone), CpuRun(relu, Packed(relu.vocab), 0), 0.15);
}

TEST_CASE("CUDA T5 stages split inside the encoder, at its end and inside the decoder match the CPU's", "[gpu]") {
  const GptConfig config = T5Config();
  const TokenBatch batch = Packed(config.vocab);
  Gpu gpu;
  for (int cut = 1; cut < kLayers; ++cut) {
    INFO("cut at layer " << cut);
    Compare(GpuRun(gpu, config, batch, cut, Recompute::kNone), CpuRun(config, batch, cut), 3e-2);
  }
}

TEST_CASE("CUDA T5 recomputation gives the same loss and gradients", "[gpu]") {
  const GptConfig config = T5Config();
  const TokenBatch batch = Packed(config.vocab);
  Gpu gpu;
  const Run none = GpuRun(gpu, config, batch, 2, Recompute::kNone);
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    const Run again = GpuRun(gpu, config, batch, 2, r);
    CHECK(again.loss == none.loss);  // the forward has no atomics: the same bits
    for (size_t k = 0; k < none.grads.size(); ++k) CHECK(RelativeError(again.grads[k], none.grads[k]) <= 1e-3);
  }
}

TEST_CASE("CUDA T5 inference gives the CPU's logits", "[gpu]") {
  const GptConfig config = T5Config();
  const TokenBatch batch = Packed(config.vocab);
  BufferPool cpu_pool(CpuAllocator());
  auto cpu = T5Stage::Create(config, Split(0)[0], &cpu_pool);
  REQUIRE_OK(cpu.status());
  RoundParams(**cpu);
  const int64_t N = batch.rows * batch.seq, V = config.vocab;
  std::vector<float> want(N * V);
  REQUIRE_OK((*cpu)->Infer(batch, nullptr, want.data()));
  Gpu gpu;
  std::unique_ptr<CudaT5Stage> stage = gpu.Stage(config, Split(0)[0]);
  Buffer logits = gpu.Bytes(N * V * sizeof(bf16));
  REQUIRE_OK(stage->Infer(batch, nullptr, logits.data()));
  CHECK(stage->in_flight() == 0);
  CHECK(RelativeError(gpu.Download(logits, N * V), want) <= 2e-2);
}

TEST_CASE("A CUDA T5 stage learns: 40 AdamW steps on one batch lower its loss", "[gpu]") {
  const GptConfig config = T5Config();
  const TokenBatch batch = Packed(config.vocab);
  const float scale = 1.0f / static_cast<float>(batch.loss_tokens);
  Gpu gpu;
  std::unique_ptr<CudaT5Stage> stage = gpu.Stage(config, Split(0)[0]);
  double first = 0, last = 0;
  for (int step = 1; step <= 40; ++step) {
    auto loss = stage->ForwardLoss(0, batch, nullptr, nullptr, scale);
    REQUIRE_OK(loss.status());
    REQUIRE(std::isfinite(*loss));
    if (step == 1) first = *loss;
    last = *loss;
    REQUIRE_OK(stage->Backward(0, nullptr, nullptr));
    OptimizerStepArgs args;
    args.adamw = optim::AdamWConfig{3e-3, 0.9, 0.95, 1e-8, 0.0};
    args.lr = 3e-3;
    args.step = step;
    REQUIRE_OK(stage->OptimizerStep(args));
    REQUIRE_OK(stage->ZeroGrads());
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("CudaT5Stage refuses what it cannot run in one line, before touching the device") {
  GptConfig gpt = T5Config();
  gpt.encoder_decoder = false;
  BufferPool pool(CpuAllocator());  // never used: every case fails first
  auto says = [](const absl::Status& s, const std::string& what) {
    return s.code() == absl::StatusCode::kInvalidArgument && std::string(s.message()).find(what) != std::string::npos;
  };
  CHECK(says(CudaT5Stage::Create(gpt, Split(0)[0], nullptr, &pool).status(), "not an encoder-decoder"));
  GptConfig buckets = T5Config();
  buckets.relative_buckets = cuda::kMaxT5Buckets + 1;
  CHECK(says(CudaT5Stage::Create(buckets, Split(0)[0], nullptr, &pool).status(), "relative_buckets"));
  GptConfig head = T5Config();
  head.heads = 4;  // head dimension 16
  CHECK(says(CudaT5Stage::Create(head, Split(0)[0], nullptr, &pool).status(), "head dimension"));
  GptConfig rotary = T5Config();  // Llama's attention inputs: T5's kernels read rows of 3C
  rotary.rotary = true;
  CHECK(says(CudaT5Stage::Create(rotary, Split(0)[0], nullptr, &pool).status(), "rotary"));
  GptConfig grouped = T5Config();
  grouped.kv_heads = grouped.heads / 2;
  CHECK(says(CudaT5Stage::Create(grouped, Split(0)[0], nullptr, &pool).status(), "grouped-query"));
}

}  // namespace
}  // namespace dynapipe::runtime::model
