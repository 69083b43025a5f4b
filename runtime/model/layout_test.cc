#include "runtime/model/layout.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

namespace dynapipe::runtime::model {
namespace {

GptConfig Config(bool tied) {
  GptConfig c;
  c.num_layers = 4;
  c.hidden = 32;
  c.heads = 4;
  c.ffn = 64;
  c.vocab = 40;
  c.max_positions = 16;
  c.tie_embeddings = tied;
  return c;
}

GptLayout Layout(const GptConfig& c, int first, int n) {
  StageOptions o{first, n, first == 0, first + n == c.num_layers, 7};
  auto l = GptLayout::Make(c, o);
  REQUIRE(l.ok());
  return *l;
}

size_t Total(const std::vector<ParamRun>& runs) {
  size_t n = 0;
  for (const ParamRun& r : runs) n += r.size;
  return n;
}

TEST_CASE("weight decay applies to matrices only: never to biases or LayerNorm gains", "[model]") {
  const GptLayout l = Layout(Config(true), 0, 4);
  int decayed = 0;
  for (const ParamInfo& p : l.params()) {
    INFO(p.name);
    const bool matrix = p.name == "wte" || p.name == "wpe" || p.name.ends_with(".w") && !p.name.ends_with("ln1.w") &&
                                                                  !p.name.ends_with("ln2.w") && p.name != "lnf.w";
    CHECK(p.decay == matrix);
    decayed += p.decay ? 1 : 0;
  }
  CHECK(decayed == 2 + 4 * 4);  // wte, wpe; qkv, proj, fc, mlp proj per layer
  // The runs cover every parameter exactly once, in order, maximal.
  const auto yes = l.DecayRuns(true), no = l.DecayRuns(false);
  CHECK(Total(yes) + Total(no) == l.num_params());
  for (const auto* runs : {&yes, &no}) {
    for (size_t i = 1; i < runs->size(); ++i) CHECK((*runs)[i - 1].offset + (*runs)[i - 1].size < (*runs)[i].offset);
  }
}

TEST_CASE("the global norm counts a tied embedding once: the first stage's copy", "[model]") {
  const GptConfig c = Config(true);
  const GptLayout first = Layout(c, 0, 2), last = Layout(c, 2, 2), whole = Layout(c, 0, 4);
  REQUIRE(first.HasSharedEmbedding());
  REQUIRE(last.HasSharedEmbedding());
  CHECK_FALSE(whole.HasSharedEmbedding());
  CHECK(first.FindParam("wte")->in_norm);
  REQUIRE(last.FindParam("wte") != nullptr);
  CHECK_FALSE(last.FindParam("wte")->in_norm);
  CHECK(whole.FindParam("wte")->in_norm);
  // Every parameter of the model counts exactly once over the two stages.
  CHECK(Total(first.NormRuns()) + Total(last.NormRuns()) == whole.num_params());
  CHECK(Total(last.NormRuns()) == last.num_params() - last.FindParam("wte")->size);
  // Untied: the head is its own parameter and counts.
  const GptLayout untied_last = Layout(Config(false), 2, 2);
  CHECK(untied_last.FindParam("wte") == nullptr);
  CHECK(untied_last.FindParam("lm_head.w")->in_norm);
  CHECK(Total(untied_last.NormRuns()) == untied_last.num_params());
}

TEST_CASE("layouts pack tensors without gaps and initialise by name, whatever the split", "[model]") {
  const GptConfig c = Config(true);
  const GptLayout whole = Layout(c, 0, 4), mid = Layout(c, 1, 2);
  size_t next = 0;
  for (const ParamInfo& p : mid.params()) {
    CHECK(p.offset == next);
    next += p.size;
  }
  CHECK(next == mid.num_params());
  std::vector<float> a(whole.num_params()), b(mid.num_params());
  whole.Initialize(a);
  mid.Initialize(b);
  for (const ParamInfo& p : mid.params()) {
    const ParamInfo* q = whole.FindParam(p.name);
    REQUIRE(q != nullptr);
    CHECK(std::equal(b.begin() + p.offset, b.begin() + p.offset + p.size, a.begin() + q->offset));
  }
  CHECK(b[mid.FindParam("h.1.ln1.w")->offset] == 1.0f);
  CHECK(b[mid.FindParam("h.1.ln1.b")->offset] == 0.0f);
  CHECK(b[mid.FindParam("h.1.attn.qkv.w")->offset] != 0.0f);
}

TEST_CASE("initialisation gives the same bits on any number of threads", "[model]") {
  // Large enough for several chunks of a million values per weight matrix.
  GptConfig c = Config(true);
  c.hidden = 512;
  c.heads = 8;
  c.ffn = 2048;
  c.vocab = 4096;
  c.max_positions = 512;
  const GptLayout layout = Layout(c, 0, 4);
  REQUIRE(layout.num_params() > (size_t{8} << 20));
  std::vector<float> one(layout.num_params()), three(layout.num_params()), automatic(layout.num_params());
  layout.Initialize(one, 1);
  layout.Initialize(three, 3);
  layout.Initialize(automatic);
  CHECK(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(one.data(), automatic.data(), one.size() * sizeof(float)) == 0);
  // Value by value what InitNormal draws (a stride through every tensor).
  const float residual_std = 0.02f / std::sqrt(2.0f * c.num_layers);
  int checked = 0;
  for (const ParamInfo& p : layout.params()) {
    if (!p.name.ends_with(".w") || p.name.find("ln") != std::string::npos) continue;
    const float std = p.name.ends_with("proj.w") ? residual_std : 0.02f;
    for (size_t i = 0; i < p.size; i += 4099) {
      REQUIRE(three[p.offset + i] == InitNormal(7, p.name, i, std));
      ++checked;
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("a layer range outside the model is refused", "[model]") {
  const GptConfig c = Config(true);
  CHECK(GptLayout::Make(c, {3, 2, false, true, 1}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(GptLayout::Make(c, {0, 2, false, false, 1}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a micro-batch whose sample is split into several runs of a row is refused", "[model]") {
  GptConfig c = Config(true);
  TokenBatch b;
  b.rows = 2;
  b.seq = 4;
  b.tokens = {1, 2, 3, 0, 4, 5, 6, 7};
  b.positions = {0, 1, 0, 0, 0, 1, 0, 1};
  b.segments = {0, 0, 1, -1, 0, 0, 1, 1};  // two samples per row, padding after
  b.targets = {2, -1, -1, -1, 5, -1, 7, -1};
  REQUIRE(CheckTokenBatch(b, c).ok());
  b.segments = {0, 0, 1, -1, 0, 1, 0, 1};  // row 1: sample 0 at 0 and 2
  const absl::Status split = CheckTokenBatch(b, c);
  CHECK(split.code() == absl::StatusCode::kInvalidArgument);
  CHECK(split.message() == "micro-batch tokens row 1: sample 0 is split into several runs");
  // An encoder-decoder's encoder rows too.
  c.encoder_decoder = true;
  c.decoder_layers = 1;
  b.segments = {0, 0, 1, -1, 0, 0, 1, 1};
  b.enc_seq = 3;
  b.enc_tokens = {1, 1, 1, 2, 2, 2};
  b.enc_segments = {0, 1, 1, 0, 1, 1};
  REQUIRE(CheckTokenBatch(b, c).ok());
  b.enc_segments = {0, 1, 0, 0, 1, 1};
  CHECK(CheckTokenBatch(b, c).message() == "micro-batch encoder row 0: sample 0 is split into several runs");
}

}  // namespace
}  // namespace dynapipe::runtime::model
