// T5Stage's refusals, each one line that names what was wrong, and nothing
// left in flight by a refused forward; recomputation's bits and memory. (Its arithmetic is checked against
// PyTorch in tests/golden, split over stages too, and in training by
// runtime/executor:worker_test.)
#include "runtime/model/t5.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace dynapipe::runtime::model {
namespace {

GptConfig Tiny() {
  GptConfig c;
  c.encoder_decoder = true;
  c.num_layers = 1;
  c.decoder_layers = 1;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.vocab = 11;
  c.max_positions = 16;
  c.norm = NormKind::kRms;
  c.mlp = MlpKind::kRelu;
  c.bias = false;
  c.relative_buckets = 8;
  c.relative_max_distance = 16;
  return c;
}

// One sample: 3 input tokens, 2 target tokens, both grids padded to 4.
TokenBatch Batch() {
  TokenBatch b;
  b.rows = 1;
  b.seq = 4;
  b.enc_seq = 4;
  b.enc_tokens = {5, 6, 7, 0};
  b.enc_segments = {0, 0, 0, -1};
  b.tokens = {0, 8, 0, 0};
  b.positions = {0, 1, 0, 0};
  b.segments = {0, 0, -1, -1};
  b.targets = {8, 9, -1, -1};
  b.real_tokens = 2;
  b.loss_tokens = 2;
  return b;
}

bool Says(const absl::Status& s, const std::string& what) {
  return !s.ok() && s.message().find(what) != std::string::npos;
}

TEST_CASE("T5Stage refuses what it cannot run in one line, and a refused forward leaves nothing in flight") {
  BufferPool pool(CpuAllocator());
  StageOptions whole{0, 2, true, true, 1};
  GptConfig gpt = Tiny();
  gpt.encoder_decoder = false;
  CHECK(Says(T5Stage::Create(gpt, whole, &pool).status(), "not an encoder-decoder"));
  auto stage = T5Stage::Create(Tiny(), whole, &pool);
  REQUIRE(stage.ok());
  T5Stage& s = **stage;

  TokenBatch short_enc = Batch();
  short_enc.enc_tokens.pop_back();
  CHECK(Says(s.Forward(0, short_enc, nullptr, nullptr, 0.5f, Recompute::kNone), "encoder tensors"));
  TokenBatch bad_token = Batch();
  bad_token.enc_tokens[0] = 99;
  CHECK(Says(s.Forward(0, bad_token, nullptr, nullptr, 0.5f, Recompute::kNone), "vocabulary"));
  CHECK(s.in_flight() == 0);

  REQUIRE(s.Forward(0, Batch(), nullptr, nullptr, 0.5f, Recompute::kNone).ok());
  CHECK(Says(s.Forward(0, Batch(), nullptr, nullptr, 0.5f, Recompute::kNone), "in flight"));
  CHECK(s.in_flight() == 1);
  REQUIRE(s.Backward(0, nullptr, nullptr).ok());
  CHECK(Says(s.Backward(0, nullptr, nullptr), "not in flight"));
  auto loss = s.TakeLoss();
  REQUIRE(loss.ok());
  CHECK(*loss > 0);  // ~ln(11) at initialisation

  // A later stage without its input, a middle stage without a place for its output.
  auto second = T5Stage::Create(Tiny(), {1, 1, false, true, 1}, &pool);
  REQUIRE(second.ok());
  CHECK(Says((*second)->Forward(0, Batch(), nullptr, nullptr, 0.5f, Recompute::kNone), "stage input"));
  auto first = T5Stage::Create(Tiny(), {0, 1, true, false, 1}, &pool);
  REQUIRE(first.ok());
  CHECK(Says((*first)->Forward(0, Batch(), nullptr, nullptr, 0.5f, Recompute::kNone), "stage output"));
  CHECK((*second)->in_flight() == 0);
  CHECK((*first)->in_flight() == 0);
  // What crosses that boundary: the encoder output alone (its end).
  CHECK((*first)->OutputBytes(Batch()) == 4 * 16 * sizeof(float));
  CHECK((*second)->InputBytes(Batch()) == (*first)->OutputBytes(Batch()));
}

struct Result {
  double loss = 0;
  std::vector<float> grads;
  size_t kept = 0;  // bytes forward kept for backward, every micro-batch in flight
};

// Two micro-batches (one of two packed samples) through a whole-model stage.
Result Run(Recompute recompute) {
  BufferPool pool(CpuAllocator());
  auto stage = T5Stage::Create(Tiny(), {0, 2, true, true, 1}, &pool);
  REQUIRE(stage.ok());
  TokenBatch packed = Batch();
  packed.enc_tokens = {5, 6, 9, 4};
  packed.enc_segments = {0, 0, 1, 1};
  packed.tokens = {0, 8, 0, 3};
  packed.segments = {0, 0, 1, 1};
  packed.targets = {8, 9, 3, 2};
  packed.real_tokens = packed.loss_tokens = 4;
  REQUIRE((*stage)->Forward(0, Batch(), nullptr, nullptr, 0.25f, recompute).ok());
  REQUIRE((*stage)->Forward(1, packed, nullptr, nullptr, 0.25f, recompute).ok());
  Result r;
  r.kept = pool.stats().in_use_bytes;
  auto loss = (*stage)->TakeLoss();
  REQUIRE(loss.ok());
  r.loss = *loss;
  REQUIRE((*stage)->Backward(1, nullptr, nullptr).ok());
  REQUIRE((*stage)->Backward(0, nullptr, nullptr).ok());
  CHECK((*stage)->in_flight() == 0);
  r.grads.assign((*stage)->grad_data().begin(), (*stage)->grad_data().end());
  return r;
}

TEST_CASE("T5 recomputation keeps less for backward and gives the same bits") {
  const Result none = Run(Recompute::kNone), selective = Run(Recompute::kSelective), full = Run(Recompute::kFull);
  INFO("kept bytes: none " << none.kept << ", selective " << selective.kept << ", full " << full.kept);
  CHECK(selective.kept < none.kept);
  CHECK(full.kept < selective.kept);
  CHECK(none.loss > 0);
  CHECK(selective.loss == none.loss);
  CHECK(full.loss == none.loss);
  CHECK(selective.grads == none.grads);
  CHECK(full.grads == none.grads);
  double sq = 0;
  for (float g : none.grads) sq += static_cast<double>(g) * g;
  CHECK(sq > 0);  // not vacuous
}

}  // namespace
}  // namespace dynapipe::runtime::model
