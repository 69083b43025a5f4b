#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "planner/partition/batch.h"
#include "src/data/synth.h"
#include "runtime/model/batch.h"
#include "runtime/model/gpt.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::runtime::model {
namespace {

GptConfig TinyConfig() {
  GptConfig c;
  c.num_layers = 4;
  c.hidden = 32;
  c.heads = 4;
  c.ffn = 64;
  c.vocab = 48;
  c.max_positions = 64;
  c.tie_embeddings = true;
  return c;
}

// A small synthetic dataset with varied lengths.
std::unique_ptr<data::Dataset> MakeDataset(int n) {
  const std::string dir = testing::FreshTempDir("gpt_ds");
  data::SynthOptions o;
  o.alphabet = 40;
  o.max_input = 40;
  o.max_target = 12;
  std::mt19937 rng(5);
  std::vector<data::RawLength> lengths;
  for (int i = 0; i < n; ++i) lengths.push_back({4 + static_cast<int64_t>(rng() % 24), 1 + static_cast<int64_t>(rng() % 8)});
  auto w = data::DatasetWriter::Create(dir, data::SynthInfo(o));
  REQUIRE(w.ok());
  REQUIRE(data::Synthesize(lengths, o, w->get()).ok());
  REQUIRE((*w)->Finish().ok());
  auto ds = data::Dataset::Open(dir);
  REQUIRE(ds.ok());
  return std::move(*ds);
}

struct Placed {
  int64_t id;
  int len, target, row, offset;
};

proto::MicroBatch Mb(int rows, int seq, const std::vector<Placed>& ps) {
  proto::MicroBatch mb;
  mb.set_rows(rows);
  mb.set_seq_len(seq);
  for (const Placed& p : ps) {
    auto* s = mb.add_samples();
    s->set_id(p.id);
    s->set_input_len(p.len);
    s->set_target_len(p.target);
    s->set_row(p.row);
    s->set_offset(p.offset);
  }
  return mb;
}

// Samples 0..n-1 of `ds`, one per row, padded to the longest (`*seq`).
std::vector<Placed> OnePerRow(const data::Dataset& ds, int n, int* seq) {
  std::vector<Placed> ps;
  *seq = 0;
  for (int i = 0; i < n; ++i) {
    const data::SampleView v = ds.sample(i);
    const int len = static_cast<int>(v.input.size() + v.target.size());
    ps.push_back({i, len, static_cast<int>(v.target.size()), i, 0});
    *seq = std::max(*seq, len);
  }
  return ps;
}

struct Result {
  double loss = 0;
  std::vector<float> grads;
};

// Runs the micro-batches through a whole-model stage; gradients accumulate.
Result RunSplit(const std::vector<proto::MicroBatch>& mbs, const data::Dataset& ds, float scale,
                GptConfig config = TinyConfig(), Recompute recompute = Recompute::kNone,
                size_t* peak_bytes = nullptr) {
  BufferPool pool(CpuAllocator());
  auto stage = GptStage::Create(config, {0, 4, true, true, 7}, &pool);
  REQUIRE(stage.ok());
  Result r;
  for (size_t m = 0; m < mbs.size(); ++m) {
    auto b = BuildTokenBatch(mbs[m], ds, 64);
    REQUIRE(b.ok());
    REQUIRE((*stage)->Forward(static_cast<int>(m), *b, nullptr, nullptr, scale, recompute).ok());
  }
  // The stage keeps the losses until the iteration's end (as the executor
  // takes them), then starts again from 0.
  auto loss = (*stage)->TakeLoss();
  REQUIRE(loss.ok());
  r.loss = *loss;
  CHECK(*(*stage)->TakeLoss() == 0.0);
  // What forward kept for backward, all micro-batches in flight.
  if (peak_bytes != nullptr) *peak_bytes = pool.stats().in_use_bytes;
  for (size_t m = mbs.size(); m-- > 0;) REQUIRE((*stage)->Backward(static_cast<int>(m), nullptr, nullptr).ok());
  r.grads.assign((*stage)->grad_data().begin(), (*stage)->grad_data().end());
  return r;
}

double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST_CASE("token batches: prompt then target, positions restart, only target predictions scored", "[model]") {
  auto ds = MakeDataset(8);
  const data::SampleView s0 = ds->sample(0), s1 = ds->sample(1);
  const int len0 = static_cast<int>(s0.input.size() + s0.target.size());
  const int t1 = static_cast<int>(s1.target.size());
  const int len1 = static_cast<int>(s1.input.size()) + t1;
  auto b = BuildTokenBatch(Mb(1, len0 + len1 + 3, {{0, len0, static_cast<int>(s0.target.size()), 0, 0},
                                                   {1, len1, t1, 0, len0}}),
                           *ds, 64);
  REQUIRE(b.ok());
  CHECK(b->real_tokens == len0 + len1);
  CHECK(b->tokens[0] == static_cast<int32_t>(s0.input[0]));
  CHECK(b->tokens[len0] == static_cast<int32_t>(s1.input[0]));
  CHECK(b->positions[len0] == 0);
  CHECK(b->segments[len0 - 1] == 0);
  CHECK(b->segments[len0] == 1);
  CHECK(b->segments[len0 + len1] == -1);
  // The last prompt position predicts the first target token.
  const int p1 = len0 + static_cast<int>(s1.input.size()) - 1;
  CHECK(b->targets[p1] == static_cast<int32_t>(s1.target[0]));
  CHECK(b->targets[p1 - 1] == -1);
  CHECK(b->targets[len0 + len1 - 1] == -1);  // nothing follows the last token
  CHECK(b->loss_tokens == static_cast<int64_t>(s0.target.size()) + t1);
  // Misplaced samples are rejected with the sample named.
  auto bad = BuildTokenBatch(Mb(1, 4, {{0, len0, 1, 0, 0}}), *ds, 64);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(BuildTokenBatch(Mb(1, 64, {{99, 4, 1, 0, 0}}), *ds, 64).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("split invariance: one micro-batch, a dynamic split and packed rows give the same loss and gradients",
          "[model]") {
  auto ds = MakeDataset(6);
  std::vector<Placed> s;
  int64_t loss_tokens = 0;
  int max_len = 0;
  for (int i = 0; i < 6; ++i) {
    const data::SampleView v = ds->sample(i);
    const int len = static_cast<int>(v.input.size() + v.target.size());
    s.push_back({i, len, static_cast<int>(v.target.size()), 0, 0});
    loss_tokens += planner::LossTokens(planner::Sample{i, len, static_cast<int>(v.target.size())}, false);
    max_len = std::max(max_len, len);
  }
  const float scale = 1.0f / static_cast<float>(loss_tokens);
  // (a) one micro-batch, one sample per row, padded to the longest.
  std::vector<Placed> one = s;
  for (int i = 0; i < 6; ++i) one[i].row = i;
  const Result a = RunSplit({Mb(6, max_len, one)}, *ds, scale);
  // (b) three micro-batches of different shapes.
  auto rows = [&](std::vector<int> ids) {
    std::vector<Placed> out;
    int seq = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      Placed p = s[ids[r]];
      p.row = static_cast<int>(r);
      seq = std::max(seq, p.len);
      out.push_back(p);
    }
    return Mb(static_cast<int>(ids.size()), seq, out);
  };
  const Result b = RunSplit({rows({0, 1}), rows({2}), rows({3, 4, 5})}, *ds, scale);
  // (c) packed: every sample back to back in two rows of 64.
  std::vector<Placed> packed;
  int offset[2] = {0, 0};
  for (int i = 0; i < 6; ++i) {
    Placed p = s[i];
    p.row = offset[0] + p.len <= 64 ? 0 : 1;
    p.offset = offset[p.row];
    offset[p.row] += p.len;
    REQUIRE(offset[p.row] <= 64);
    packed.push_back(p);
  }
  const Result c = RunSplit({Mb(2, 64, packed)}, *ds, scale);

  CHECK(a.loss > 1.0);
  CHECK(std::abs(b.loss - a.loss) <= 1e-5 * a.loss);
  CHECK(std::abs(c.loss - a.loss) <= 1e-5 * a.loss);
  CHECK(RelDiff(b.grads, a.grads) <= 1e-5);
  CHECK(RelDiff(c.grads, a.grads) <= 1e-5);
  // The materialised attention kernel (model.attention) only costs more:
  // padded and packed rows give the same losses and gradients up to how
  // GEMM blocks group the sums.
  GptConfig materialized = TinyConfig();
  proto::ModelSpec spec;
  spec.set_kind(proto::ModelKind::gpt);
  spec.set_num_layers(4), spec.set_hidden(32), spec.set_heads(4), spec.set_ffn(128), spec.set_vocab(48);
  spec.set_max_positions(64);
  spec.set_attention(proto::AttentionKernel::materialized);
  auto from_spec = GptConfig::FromSpec(spec);
  REQUIRE(from_spec.ok());
  CHECK(from_spec->attention == AttentionKernel::kMaterialized);
  materialized.attention = from_spec->attention;
  const Result am = RunSplit({Mb(6, max_len, one)}, *ds, scale, materialized);
  const Result cm = RunSplit({Mb(2, 64, packed)}, *ds, scale, materialized);
  CHECK(std::abs(am.loss - a.loss) <= 1e-6 * a.loss);
  CHECK(RelDiff(am.grads, a.grads) <= 1e-6);
  CHECK(std::abs(cm.loss - c.loss) <= 1e-6 * c.loss);
  CHECK(RelDiff(cm.grads, c.grads) <= 1e-6);
  // Sensitivity: a different scale changes the gradients.
  const Result d = RunSplit({Mb(6, max_len, one)}, *ds, scale * 2);
  CHECK(RelDiff(d.grads, a.grads) > 0.5);
}

TEST_CASE("stages chained give the whole model's loss and gradients; initialisation ignores the split", "[model]") {
  auto ds = MakeDataset(4);
  int seq = 0;
  const std::vector<Placed> ps = OnePerRow(*ds, 4, &seq);
  auto batch = BuildTokenBatch(Mb(4, seq, ps), *ds, 64);
  REQUIRE(batch.ok());
  const float scale = 1.0f / static_cast<float>(batch->loss_tokens);
  const Result whole = RunSplit({Mb(4, seq, ps)}, *ds, scale);

  BufferPool pool(CpuAllocator());
  auto s0 = GptStage::Create(TinyConfig(), {0, 1, true, false, 7}, &pool);
  auto s1 = GptStage::Create(TinyConfig(), {1, 2, false, false, 7}, &pool);
  auto s2 = GptStage::Create(TinyConfig(), {3, 1, false, true, 7}, &pool);
  REQUIRE((s0.ok() && s1.ok() && s2.ok()));
  CHECK((*s0)->HasSharedEmbedding());
  CHECK(!(*s1)->HasSharedEmbedding());
  const int64_t H = (*s0)->HiddenElements(*batch);
  std::vector<float> h0(H), h1(H), d1(H), d0(H);
  REQUIRE((*s0)->ForwardLoss(0, *batch, nullptr, h0.data(), scale).ok());
  REQUIRE((*s1)->ForwardLoss(0, *batch, h0.data(), h1.data(), scale).ok());
  auto loss = (*s2)->ForwardLoss(0, *batch, h1.data(), nullptr, scale);
  REQUIRE(loss.ok());
  CHECK(std::abs(*loss - whole.loss) <= 1e-6 * whole.loss);
  REQUIRE((*s2)->Backward(0, nullptr, d1.data()).ok());
  REQUIRE((*s1)->Backward(0, d1.data(), d0.data()).ok());
  REQUIRE((*s0)->Backward(0, d0.data(), nullptr).ok());
  CHECK((*s2)->in_flight() == 0);

  BufferPool pool2(CpuAllocator());
  auto ref = GptStage::Create(TinyConfig(), {0, 4, true, true, 7}, &pool2);
  REQUIRE(ref.ok());
  std::vector<float> wte_sum;
  for (const auto* st : {s0->get(), s1->get(), s2->get()}) {
    for (const ParamInfo& p : st->layout().params()) {
      const ParamInfo* q = (*ref)->FindParam(p.name);
      REQUIRE(q != nullptr);
      // Same initial weights whatever the split.
      CHECK(std::equal(st->param_data().begin() + p.offset, st->param_data().begin() + p.offset + p.size,
                       (*ref)->param_data().begin() + q->offset));
      std::vector<float> g(st->grad_data().begin() + p.offset, st->grad_data().begin() + p.offset + p.size);
      if (p.name == "wte") {
        if (wte_sum.empty()) {
          wte_sum = g;
        } else {
          for (size_t i = 0; i < g.size(); ++i) wte_sum[i] += g[i];
        }
        continue;
      }
      std::vector<float> want(whole.grads.begin() + q->offset, whole.grads.begin() + q->offset + q->size);
      INFO(p.name);
      CHECK(RelDiff(g, want) <= 1e-5);
    }
  }
  const ParamInfo* w = (*ref)->FindParam("wte");
  CHECK(RelDiff(wte_sum, std::vector<float>(whole.grads.begin() + w->offset, whole.grads.begin() + w->offset + w->size)) <=
        1e-5);
}

TEST_CASE("varlen training runs on the real tokens only; padding gets zero hidden states and gradients", "[model]") {
  auto ds = MakeDataset(4);
  int seq = 0;
  const std::vector<Placed> ps = OnePerRow(*ds, 4, &seq);
  auto batch = BuildTokenBatch(Mb(4, seq, ps), *ds, 64);
  REQUIRE(batch.ok());
  REQUIRE(batch->real_tokens < batch->rows * batch->seq);  // the batch has padding
  const float scale = 1.0f / static_cast<float>(batch->loss_tokens);
  struct Run {
    std::vector<float> h, d;
    size_t kept = 0;
  };
  // A middle stage (input and output hidden states) under either kernel.
  auto run = [&](AttentionKernel kernel) {
    GptConfig c = TinyConfig();
    c.attention = kernel;
    BufferPool pool(CpuAllocator());
    auto st = GptStage::Create(c, {1, 2, false, false, 7}, &pool);
    REQUIRE(st.ok());
    const int64_t H = (*st)->HiddenElements(*batch);
    std::vector<float> in(H), dout(H);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    for (float& x : in) x = nd(rng);
    for (float& x : dout) x = nd(rng) * 1e-3f;
    Run r;
    r.h.assign(H, 1.0f);
    r.d.assign(H, 1.0f);
    REQUIRE((*st)->ForwardLoss(0, *batch, in.data(), r.h.data(), scale).ok());
    r.kept = pool.stats().in_use_bytes;
    REQUIRE((*st)->Backward(0, dout.data(), r.d.data()).ok());
    return r;
  };
  const Run varlen = run(AttentionKernel::kVarlen);
  const Run dense = run(AttentionKernel::kMaterialized);
  const int64_t C = TinyConfig().hidden;
  std::vector<float> hv, hd, dv, dd;
  double padding_abs = 0;
  for (int64_t k = 0; k < batch->rows * batch->seq; ++k) {
    for (int64_t j = 0; j < C; ++j) {
      const int64_t i = k * C + j;
      if (batch->segments[k] < 0) {
        padding_abs += std::abs(varlen.h[i]) + std::abs(varlen.d[i]);
        continue;
      }
      hv.push_back(varlen.h[i]), hd.push_back(dense.h[i]);
      dv.push_back(varlen.d[i]), dd.push_back(dense.d[i]);
    }
  }
  CHECK(padding_abs == 0);
  CHECK(RelDiff(hv, hd) <= 1e-6);
  CHECK(RelDiff(dv, dd) <= 1e-6);
  CHECK(RelDiff(dv, std::vector<float>(dv.size(), 0.0f)) > 0.5);  // gradients flowed
  CHECK(varlen.kept < dense.kept);  // activations of real tokens only
}

TEST_CASE("recomputation (selective, full) keeps less and gives bit-identical loss and gradients", "[model]") {
  auto ds = MakeDataset(6);
  auto placed = [&](int id, int row, int offset) {
    const data::SampleView v = ds->sample(id);
    return Placed{id, static_cast<int>(v.input.size() + v.target.size()), static_cast<int>(v.target.size()), row,
                  offset};
  };
  // Padded rows, and one packed row of two samples.
  const Placed p4 = placed(4, 0, 0), p5 = placed(5, 0, p4.len);
  const std::vector<proto::MicroBatch> mbs = {Mb(2, 40, {placed(0, 0, 0), placed(1, 1, 0)}),
                                              Mb(1, 40, {placed(2, 0, 0)}), Mb(1, 64, {p4, p5})};
  const float scale = 1.0f / 50;
  size_t kept_none = 0, kept_selective = 0, kept_full = 0;
  const Result none = RunSplit(mbs, *ds, scale, TinyConfig(), Recompute::kNone, &kept_none);
  const Result selective = RunSplit(mbs, *ds, scale, TinyConfig(), Recompute::kSelective, &kept_selective);
  const Result full = RunSplit(mbs, *ds, scale, TinyConfig(), Recompute::kFull, &kept_full);
  CHECK(kept_selective < kept_none);
  CHECK(kept_full < kept_selective);
  CHECK(selective.loss == none.loss);
  CHECK(full.loss == none.loss);
  CHECK(selective.grads == none.grads);
  CHECK(full.grads == none.grads);
}

}  // namespace
}  // namespace dynapipe::runtime::model

namespace dynapipe::runtime::model {
namespace {

TEST_CASE("GradSumsOfSquares sums each piece's norm-group gradients; a sharded optimizer keeps only its moments",
          "[model]") {
  BufferPool pool(CpuAllocator());
  // The last stage of a tied model: its wte copy is not in the norm group.
  auto stage = GptStage::Create(TinyConfig(), {3, 1, false, true, 7}, &pool);
  REQUIRE(stage.ok());
  GptStage& st = **stage;
  std::span<float> g = st.grad_data();
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>(i % 97) - 0.04f;
  const ParamInfo* wte = st.FindParam("wte");
  REQUIRE(wte != nullptr);
  const size_t n = st.layout().num_params();
  const std::vector<ParamRun> pieces = {{0, n / 3}, {n / 3, n - n / 3}, {wte->offset, wte->size}};
  std::vector<double> sums(pieces.size());
  REQUIRE(st.GradSumsOfSquares(pieces, sums).ok());
  for (size_t p = 0; p < pieces.size(); ++p) {
    double want = 0;
    for (const ParamRun& r : st.layout().NormRuns()) {
      for (size_t k = std::max(r.offset, pieces[p].offset);
           k < std::min(r.offset + r.size, pieces[p].offset + pieces[p].size); ++k) {
        want += static_cast<double>(g[k]) * g[k];
      }
    }
    INFO("piece " << p);
    CHECK(sums[p] == want);
  }
  CHECK(sums[2] == 0);  // the tied copy counts on the first stage
  CHECK(sums[0] + sums[1] > 0);
  CHECK_FALSE(st.GradSumsOfSquares(pieces, std::span<double>(sums).first(2)).ok());

  const size_t whole = st.state_bytes();
  REQUIRE(st.ShardOptimizer(std::vector<ParamRun>{{0, n / 2}}).ok());
  CHECK(st.state_bytes() < whole);
  CHECK(absl::IsInvalidArgument(st.ShardOptimizer(std::vector<ParamRun>{{0, n / 2}, {n / 4, 10}})));  // overlap
  CHECK(absl::IsInvalidArgument(st.ShardOptimizer(std::vector<ParamRun>{{n - 1, 2}})));            // outside
}

}  // namespace
}  // namespace dynapipe::runtime::model
