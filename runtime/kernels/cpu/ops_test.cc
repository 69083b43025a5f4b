// Every op's backward against central finite differences in double
// precision, plus the masking guarantees of attention.
#include "runtime/kernels/cpu/ops.h"

#include <cmath>
#include <limits>

#include <catch2/catch.hpp>
#include <functional>
#include <random>
#include <vector>

#include "runtime/kernels/cpu/gradient_check.h"
#include "runtime/kernels/cpu/vec_math.h"

namespace dynapipe::runtime::cpu {
namespace {

using Catch::Detail::Approx;

TEST_CASE("Matmul backward matches finite differences") {
  std::mt19937 rng(1);
  const int N = 5, C = 4, OC = 3;
  Vec inp = Random(N * C, rng), w = Random(OC * C, rng), b = Random(OC, rng), r = Random(N * OC, rng);
  Vec out(N * OC);
  auto loss = [&] {
    MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    return Dot(out, r);
  };
  Vec dinp(N * C, 0), dw(OC * C, 0), db(OC, 0);
  loss();
  MatmulBackward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, C, OC);
  CheckGradient("dinp", inp, dinp, loss);
  CheckGradient("dweight", w, dw, loss);
  CheckGradient("dbias", b, db, loss);
}

TEST_CASE("LayerNorm backward matches finite differences") {
  std::mt19937 rng(2);
  const int N = 4, C = 6;
  Vec inp = Random(N * C, rng, 2.0), w = Random(C, rng), b = Random(C, rng), r = Random(N * C, rng);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return Dot(out, r);
  };
  loss();
  Vec dinp(N * C, 0), dw(C, 0), db(C, 0);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), mean.data(), rstd.data(), N, C);
  CheckGradient("dinp", inp, dinp, loss);
  CheckGradient("dweight", w, dw, loss);
  CheckGradient("dbias", b, db, loss);
}

TEST_CASE("LayerNorm without a bias: no shift, and no bias gradient written") {
  std::mt19937 rng(21);
  const int N = 3, C = 7;
  Vec inp = Random(N * C, rng, 2.0), w = Random(C, rng), zero(C, 0.0), r = Random(N * C, rng);
  Vec out(N * C), with_zero(N * C), mean(N), rstd(N);
  LayerNormForward(with_zero.data(), mean.data(), rstd.data(), inp.data(), w.data(), zero.data(), N, C);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), static_cast<const double*>(nullptr),
                     N, C);
    return Dot(out, r);
  };
  loss();
  CHECK(out == with_zero);
  Vec dinp(N * C, 0), dw(C, 0);
  LayerNormBackward(dinp.data(), dw.data(), static_cast<double*>(nullptr), r.data(), inp.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  CheckGradient("dinp", inp, dinp, loss);
  CheckGradient("dweight", w, dw, loss);
}

TEST_CASE("RMS norm backward matches finite differences") {
  std::mt19937 rng(22);
  const int N = 4, C = 6;
  Vec inp = Random(N * C, rng, 2.0), w = Random(C, rng), r = Random(N * C, rng);
  Vec out(N * C), rstd(N);
  auto loss = [&] {
    RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C);
    return Dot(out, r);
  };
  loss();
  // The definition, for one element.
  double ms = 0;
  for (int c = 0; c < C; ++c) ms += inp[c] * inp[c];
  CHECK(out[2] == Approx(inp[2] / std::sqrt(ms / C + kRmsNormEps) * w[2]).epsilon(1e-12));
  Vec dinp(N * C, 0), dw(C, 0);
  RmsNormBackward(dinp.data(), dw.data(), r.data(), inp.data(), w.data(), rstd.data(), N, C);
  CheckGradient("dinp", inp, dinp, loss);
  CheckGradient("dweight", w, dw, loss);
}

TEST_CASE("ReLU and gated GELU backward match finite differences") {
  std::mt19937 rng(23);
  Vec inp = Random(20, rng, 2.0), r = Random(20, rng), out(20);
  for (double& x : inp) x += x > 0 ? 0.1 : -0.1;  // away from the kink
  auto relu = [&] {
    ReluForward(out.data(), inp.data(), 20);
    return Dot(out, r);
  };
  Vec drelu(20, 0);
  ReluBackward(drelu.data(), inp.data(), r.data(), 20);
  CheckGradient("relu", inp, drelu, relu);

  const int N = 3, F = 5;
  Vec gu = Random(N * 2 * F, rng, 1.5), gr = Random(N * F, rng), gout(N * F);
  auto gated = [&] {
    GatedGeluForward(gout.data(), gu.data(), N, F);
    return Dot(gout, gr);
  };
  gated();
  Vec gelu(1);
  GeluForward(gelu.data(), &gu[2 * F + 1], 1);  // row 1, gate 1
  CHECK(gout[F + 1] == Approx(gelu[0] * gu[2 * F + F + 1]).epsilon(1e-12));
  Vec dgu(N * 2 * F, 0);
  GatedGeluBackward(dgu.data(), gu.data(), gr.data(), N, F);
  CheckGradient("gated gelu", gu, dgu, gated);
}

TEST_CASE("GELU backward matches finite differences") {
  std::mt19937 rng(3);
  Vec inp = Random(20, rng, 2.0), r = Random(20, rng), out(20);
  auto loss = [&] {
    GeluForward(out.data(), inp.data(), 20);
    return Dot(out, r);
  };
  Vec dinp(20, 0);
  GeluBackward(dinp.data(), inp.data(), r.data(), 20);
  CheckGradient("dinp", inp, dinp, loss);
}

TEST_CASE("Attention backward matches finite differences with padding and packed segments") {
  const AttentionKernel kernel = GENERATE(AttentionKernel::kVarlen, AttentionKernel::kMaterialized);
  INFO("materialized: " << (kernel == AttentionKernel::kMaterialized));
  std::mt19937 rng(4);
  const int B = 2, T = 5, C = 4, NH = 2;
  // Row 0: one sample of 3 tokens then padding; row 1: two packed samples.
  const std::vector<int32_t> seg = {0, 0, 0, -1, -1, 0, 0, 1, 1, 1};
  Vec qkv = Random(B * T * 3 * C, rng), r = Random(B * T * C, rng), out(B * T * C);
  Vec att(AttentionProbsSize(seg.data(), B, T, NH, kernel));
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH, kernel);
    return Dot(out, r);
  };
  loss();
  Vec dqkv(qkv.size(), 0);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH, kernel);
  CheckGradient("dqkv", qkv, dqkv, loss);
  // Padding tokens get no gradient.
  for (int t : {3, 4}) {
    for (int k = 0; k < 3 * C; ++k) CHECK(dqkv[t * 3 * C + k] == 0.0);
  }
}

TEST_CASE("RelativePositionBucket: T5's buckets (32, max distance 128)") {
  // Bidirectional: keys before the query in 0..15, after it in 16..31; the
  // first 8 of each half exact, then logarithmic, capped.
  CHECK(RelativePositionBucket(0, true, 32, 128) == 0);
  CHECK(RelativePositionBucket(-1, true, 32, 128) == 1);
  CHECK(RelativePositionBucket(1, true, 32, 128) == 17);
  CHECK(RelativePositionBucket(-7, true, 32, 128) == 7);
  CHECK(RelativePositionBucket(-8, true, 32, 128) == 8);   // 8 + int(log(1) / log(16) * 8)
  CHECK(RelativePositionBucket(-100, true, 32, 128) == 15);  // 8 + int(7.29)
  CHECK(RelativePositionBucket(-20, true, 32, 128) == 10);   // 8 + int(2.64)
  CHECK(RelativePositionBucket(200, true, 32, 128) == 31);   // capped
  // One-way: later keys share bucket 0; 16 exact distances, then log.
  CHECK(RelativePositionBucket(5, false, 32, 128) == 0);
  CHECK(RelativePositionBucket(-5, false, 32, 128) == 5);
  CHECK(RelativePositionBucket(-15, false, 32, 128) == 15);
  CHECK(RelativePositionBucket(-16, false, 32, 128) == 16);
  CHECK(RelativePositionBucket(-40, false, 32, 128) == 23);  // 16 + int(log(2.5) / log(8) * 16) = 16 + int(7.05)
  CHECK(RelativePositionBucket(-1000, false, 32, 128) == 31);
}

TEST_CASE("T5's attention (bidirectional or causal, unscaled, relative bias) matches finite differences") {
  const AttentionKernel kernel = GENERATE(AttentionKernel::kVarlen, AttentionKernel::kMaterialized);
  const bool causal = GENERATE(false, true);
  INFO("materialized: " << (kernel == AttentionKernel::kMaterialized) << " causal: " << causal);
  std::mt19937 rng(41);
  const int B = 2, T = 6, C = 4, NH = 2, buckets = 8;
  const std::vector<int32_t> seg = {0, 0, 0, 0, -1, -1, 0, 0, 1, 1, 1, 1};
  Vec qkv = Random(B * T * 3 * C, rng), r = Random(B * T * C, rng), out(B * T * C);
  Vec bias = Random(buckets * NH, rng);
  Vec att(AttentionProbsSize(seg.data(), B, T, NH, kernel));
  AttentionOptions<double> o;
  o.causal = causal;
  o.scaled = false;
  o.bias = bias.data();
  o.buckets = buckets;
  o.max_distance = 16;
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH, kernel, o);
    return Dot(out, r);
  };
  loss();
  // Query 1 of row 1's second sample (token 9), head 0, by the definition.
  {
    const int64_t hs = C / NH, i = 9;
    std::vector<double> score;
    for (int64_t j = 8; j < 12; ++j) {
      if (causal && j > i) continue;
      double dot = 0;
      for (int64_t d = 0; d < hs; ++d) dot += qkv[i * 3 * C + d] * qkv[j * 3 * C + C + d];
      score.push_back(dot + bias[RelativePositionBucket(static_cast<int>(j - i), !causal, buckets, 16) * NH]);
    }
    const double mx = *std::max_element(score.begin(), score.end());
    double sum = 0, want = 0;
    for (double& x : score) sum += (x = std::exp(x - mx));
    for (size_t k = 0; k < score.size(); ++k) want += score[k] / sum * qkv[(8 + k) * 3 * C + 2 * C];
    CHECK(out[i * C] == Approx(want).epsilon(1e-12));
  }
  Vec dqkv(qkv.size(), 0), dbias(bias.size(), 0);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH, kernel, o, dbias.data());
  CheckGradient("dqkv", qkv, dqkv, loss);
  CheckGradient("dbias", bias, dbias, loss);
  // GPT's scaled attention with a bias: the bias gradient leaves the scale out.
  o.scaled = true;
  Vec dq2(qkv.size(), 0), db2(bias.size(), 0);
  loss();
  AttentionBackward(dq2.data(), r.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH, kernel, o, db2.data());
  CheckGradient("dqkv scaled", qkv, dq2, loss);
  CheckGradient("dbias scaled", bias, db2, loss);
}

TEST_CASE("Cross-attention: finite differences, the definition, and samples that never see each other") {
  const bool scaled = GENERATE(false, true);
  INFO("scaled: " << scaled);
  std::mt19937 rng(43);
  const int B = 2, Tq = 6, Tk = 7, C = 4, NH = 2;
  // Row 0 packs samples 0 and 1 (sample 2 has queries but no keys); row 1 one
  // sample, both sides padded.
  const std::vector<int32_t> seg_q = {0, 0, 1, 1, 2, -1, 0, 0, 0, -1, -1, -1};
  const std::vector<int32_t> seg_k = {0, 0, 0, 1, 1, -1, -1, 0, 0, 0, 0, 0, -1, -1};
  Vec q = Random(B * Tq * C, rng), kv = Random(B * Tk * 2 * C, rng), r = Random(B * Tq * C, rng), out(B * Tq * C);
  Vec att(CrossAttentionProbsSize(seg_q.data(), seg_k.data(), B, Tq, Tk, NH));
  REQUIRE(att.size() == static_cast<size_t>(NH * (2 * 3 + 2 * 2 + 3 * 5)));
  auto loss = [&] {
    CrossAttentionForward(out.data(), att.data(), q.data(), kv.data(), seg_q.data(), seg_k.data(), B, Tq, Tk, C, NH,
                          scaled);
    return Dot(out, r);
  };
  loss();
  {  // row 0, query 3 (sample 1), head 1, first output feature
    const int64_t hs = C / NH, i = 3;
    std::vector<double> score;
    for (int64_t j : {3, 4}) {
      double dot = 0;
      for (int64_t d = 0; d < hs; ++d) dot += q[i * C + hs + d] * kv[j * 2 * C + hs + d];
      score.push_back(scaled ? dot / std::sqrt(double(hs)) : dot);
    }
    const double mx = std::max(score[0], score[1]);
    const double e0 = std::exp(score[0] - mx), e1 = std::exp(score[1] - mx);
    const double want = (e0 * kv[3 * 2 * C + C + hs] + e1 * kv[4 * 2 * C + C + hs]) / (e0 + e1);
    CHECK(out[i * C + hs] == Approx(want).epsilon(1e-12));
  }
  for (int t : {4, 5, 9, 10, 11}) {  // no keys, or padding: zeros
    for (int c = 0; c < C; ++c) CHECK(out[t * C + c] == 0.0);
  }
  Vec dq(q.size(), 0), dkv(kv.size(), 0);
  CrossAttentionBackward(dq.data(), dkv.data(), r.data(), q.data(), kv.data(), att.data(), seg_q.data(),
                         seg_k.data(), B, Tq, Tk, C, NH, scaled);
  CheckGradient("dq", q, dq, loss);
  CheckGradient("dkv", kv, dkv, loss);
  // Sample 1's keys change nothing of sample 0 in the same row.
  loss();
  const Vec before = out;
  for (int k = 0; k < 2 * C; ++k) kv[3 * 2 * C + k] += 1.5;
  loss();
  for (int t : {0, 1}) {
    for (int c = 0; c < C; ++c) CHECK(out[t * C + c] == before[t * C + c]);
  }
}

TEST_CASE("Attention: padding never changes a real token; packed samples never see each other") {
  std::mt19937 rng(5);
  const int B = 1, T = 6, C = 4, NH = 1;
  const std::vector<int32_t> packed = {0, 0, 1, 1, 1, -1};
  Vec qkv = Random(T * 3 * C, rng), out(T * C), att(T * T);  // at least what varlen keeps
  AttentionForward(out.data(), att.data(), qkv.data(), packed.data(), B, T, C, NH);
  const Vec before = out;
  // Perturb the padding token and the first sample: the second sample's
  // outputs stay bit-identical, and the padding output stays zero.
  for (int k = 0; k < 3 * C; ++k) {
    qkv[5 * 3 * C + k] += 3.0;
    qkv[0 * 3 * C + k] -= 2.0;
  }
  AttentionForward(out.data(), att.data(), qkv.data(), packed.data(), B, T, C, NH);
  for (int t = 2; t < 5; ++t) {
    for (int c = 0; c < C; ++c) CHECK(out[t * C + c] == before[t * C + c]);
  }
  for (int c = 0; c < C; ++c) CHECK(out[5 * C + c] == 0.0);
  // A sample alone in its own row gives the same result as packed.
  std::vector<int32_t> alone = {0, 0, 0, -1, -1, -1};
  Vec qkv2(T * 3 * C, 0.0), out2(T * C), att2(T * T);
  std::copy(qkv.begin() + 2 * 3 * C, qkv.begin() + 5 * 3 * C, qkv2.begin());
  AttentionForward(out2.data(), att2.data(), qkv2.data(), alone.data(), B, T, C, NH);
  for (int t = 0; t < 3; ++t) {
    for (int c = 0; c < C; ++c) CHECK(out2[t * C + c] == Approx(out[(t + 2) * C + c]).epsilon(1e-12));
  }
}

TEST_CASE("Materialized and varlen attention agree, forward and backward") {
  // fp32, the training type: masked pairs contribute exact zeros, so the two
  // differ only in how GEMM blocks group the same sums (1e-6 relative).
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  // T > 64: several query blocks per span. A padded row, a packed row of
  // three samples ending in padding, and a row of padding only.
  const int B = 3, T = 150, C = 8, NH = 2;
  std::vector<int32_t> seg(B * T, -1);
  for (int t = 0; t < 120; ++t) seg[t] = 0;
  for (int t = 0; t < 140; ++t) seg[T + t] = t < 70 ? 0 : t < 75 ? 1 : 2;
  std::vector<float> qkv(B * T * 3 * C), dout(B * T * C);
  for (auto& x : qkv) x = d(rng);
  for (auto& x : dout) x = d(rng);
  struct Result {
    std::vector<float> out, dqkv;
    int64_t probs = 0;
  };
  auto run = [&](AttentionKernel kernel) {
    Result r{std::vector<float>(B * T * C, 7.0f), std::vector<float>(qkv.size(), 0.f),
             AttentionProbsSize(seg.data(), B, T, NH, kernel)};
    std::vector<float> att(r.probs);
    AttentionForward(r.out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH, kernel);
    AttentionBackward(r.dqkv.data(), dout.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH, kernel);
    return r;
  };
  const Result varlen = run(AttentionKernel::kVarlen);
  const Result materialized = run(AttentionKernel::kMaterialized);
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  CHECK(rel(materialized.out, varlen.out) < 1e-6);
  CHECK(rel(materialized.dqkv, varlen.dqkv) < 1e-6);
  // Padding outputs are exact zeros and padding gets no gradient, either way.
  for (const Result* r : {&varlen, &materialized}) {
    for (int t = 0; t < B * T; ++t) {
      if (seg[t] >= 0) continue;
      for (int c = 0; c < C; ++c) REQUIRE(r->out[t * C + c] == 0.0f);
      for (int c = 0; c < 3 * C; ++c) REQUIRE(r->dqkv[t * 3 * C + c] == 0.0f);
    }
  }
  // Varlen keeps the probabilities of the samples only: 120^2 + 70^2 + 5^2 +
  // 65^2 per head against 3 x 150^2 for whole rows.
  CHECK(varlen.probs == NH * (120 * 120 + 70 * 70 + 5 * 5 + 65 * 65));
  CHECK(materialized.probs == NH * 3 * T * T);
  // Not vacuous: real tokens have non-zero outputs and gradients.
  CHECK(varlen.out[0] != 0.0f);
  CHECK(varlen.dqkv[(T + 71) * 3 * C] != 0.0f);  // q of the packed row's second sample, second token
}

TEST_CASE("Attention: a segment id that comes back later in its row still attends to itself only") {
  // Not what our batching produces, but within the contract: the varlen
  // kernel treats such a row as one masked span and stays exact.
  std::mt19937 rng(10);
  const int B = 1, T = 6, C = 4, NH = 2;
  const std::vector<int32_t> seg = {0, 0, 1, 1, 0, -1};
  Vec qkv = Random(T * 3 * C, rng), r = Random(T * C, rng), out(T * C);
  Vec att(AttentionProbsSize(seg.data(), B, T, NH));
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH);
    return Dot(out, r);
  };
  loss();
  Vec dqkv(qkv.size(), 0);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH);
  CheckGradient("dqkv", qkv, dqkv, loss);
  // Token 4 (segment 0 again) sees tokens 0, 1 and itself, not 2 and 3.
  const Vec before = out;
  for (int k = 0; k < 3 * C; ++k) qkv[2 * 3 * C + k] += 1.0, qkv[3 * 3 * C + k] -= 1.0;
  loss();
  for (int c = 0; c < C; ++c) CHECK(out[4 * C + c] == before[4 * C + c]);
  CHECK(out[3 * C] != before[3 * C]);
}

TEST_CASE("Embedding backward matches finite differences") {
  std::mt19937 rng(6);
  const int N = 5, C = 3, V = 4, P = 6;
  const std::vector<int32_t> tok = {1, 3, 1, 0, 2}, pos = {0, 1, 2, 0, 5};
  Vec wte = Random(V * C, rng), wpe = Random(P * C, rng), r = Random(N * C, rng), out(N * C);
  auto loss = [&] {
    EmbeddingForward(out.data(), tok.data(), pos.data(), wte.data(), wpe.data(), N, C);
    return Dot(out, r);
  };
  Vec dwte(V * C, 0), dwpe(P * C, 0);
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), tok.data(), pos.data(), N, C);
  CheckGradient("dwte", wte, dwte, loss);
  CheckGradient("dwpe", wpe, dwpe, loss);
}

TEST_CASE("Cross-entropy backward matches finite differences; ignored rows contribute nothing") {
  std::mt19937 rng(7);
  const int N = 4, V = 5;
  const std::vector<int32_t> targets = {2, -1, 0, 4};
  const double scale = 1.0 / 3;  // three scored tokens
  Vec logits = Random(N * V, rng, 2.0), probs(N * V);
  auto loss = [&] { return CrossEntropyForward(probs.data(), logits.data(), targets.data(), scale, N, V); };
  loss();
  Vec dlogits(N * V, 0);
  CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), scale, N, V);
  CheckGradient("dlogits", logits, dlogits, loss);
  for (int v = 0; v < V; ++v) CHECK(dlogits[1 * V + v] == 0.0);
}

// Distance in units in the last place of `want` (rounded to float).
double Ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(std::abs(w), std::numeric_limits<float>::infinity()) - std::abs(w);
  return std::abs(static_cast<double>(got) - want) / ulp;
}

TEST_CASE("SIMD exp is within 2 ulp of exp over the float range; masks and limits exact") {
  std::vector<float> x;
  for (double v = -87.0; v <= 88.5; v += 0.00731) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f * 0.6931472f, 88.7f, -87.33f}) x.push_back(v);
  std::vector<float> y(x.size());
  simd::Map(y.data(), x.data(), static_cast<int64_t>(x.size()), [](simd::VF v) { return simd::Exp(v); });
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, Ulps(y[i], std::exp(static_cast<double>(x[i]))));
  CHECK(worst <= 2.0);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edge = {-inf, -1000.0f, -88.0f, inf, 100.0f, std::nanf("")}, out(edge.size());
  simd::Map(out.data(), edge.data(), 6, [](simd::VF v) { return simd::Exp(v); });
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == 0.0f);  // below the smallest normal result: flushed
  CHECK(out[3] == inf);
  CHECK(out[4] == inf);
  CHECK(std::isnan(out[5]));
}

TEST_CASE("GELU: the exp form equals the tanh form; float within a few ulp of double") {
  const int n = 4001;
  Vec x(n);
  for (int i = 0; i < n; ++i) x[i] = -12.0 + 24.0 * i / (n - 1);
  Vec ref(n), dref(n, 0), ones(n, 1.0);
  GeluForward(ref.data(), x.data(), n);
  GeluBackward(dref.data(), x.data(), ones.data(), n);
  const double k = std::sqrt(2.0 / M_PI);
  for (int i = 0; i < n; ++i) {
    const double v = x[i], u = k * (v + 0.044715 * v * v * v), th = std::tanh(u);
    const double tanh_form = 0.5 * v * (1 + th);
    const double tanh_grad = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * 0.044715 * v * v);
    CHECK(std::abs(ref[i] - tanh_form) <= 1e-14 * std::max(1.0, std::abs(tanh_form)));
    CHECK(std::abs(dref[i] - tanh_grad) <= 1e-14);
  }
  std::vector<float> xf(x.begin(), x.end()), yf(n), df(n, 0.0f), onesf(n, 1.0f);
  GeluForward(yf.data(), xf.data(), n);
  GeluBackward(df.data(), xf.data(), onesf.data(), n);
  // Against double GELU at the float input (so input rounding does not count).
  Vec xr(xf.begin(), xf.end()), yr(n), dr(n, 0);
  GeluForward(yr.data(), xr.data(), n);
  GeluBackward(dr.data(), xr.data(), ones.data(), n);
  double worst_y = 0, worst_d = 0;
  for (int i = 0; i < n; ++i) {
    worst_y = std::max(worst_y, std::abs(yf[i] - yr[i]) / std::max(std::abs(yr[i]), 1e-3));
    worst_d = std::max(worst_d, std::abs(df[i] - dr[i]));
  }
  CHECK(worst_y < 1e-6);
  CHECK(worst_d < 1e-6);
}

TEST_CASE("The float kernels agree with the double ones") {
  {  // LayerNorm, a width with a SIMD tail
    std::mt19937 rng(11);
    const int N = 5, C = 37;
    Vec inp = Random(N * C, rng, 3.0), w = Random(C, rng), b = Random(C, rng), dy = Random(N * C, rng);
    Vec out(N * C), mean(N), rstd(N), dx(N * C, 0), dw(C, 0), db(C, 0);
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), inp.data(), w.data(), mean.data(), rstd.data(), N,
                      C);
    auto f = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
    std::vector<float> fi = f(inp), fw = f(w), fb = f(b), fdy = f(dy), fo(N * C), fm(N), fr(N), fdx(N * C, 0),
                       fdw(C, 0), fdb(C, 0);
    LayerNormForward(fo.data(), fm.data(), fr.data(), fi.data(), fw.data(), fb.data(), N, C);
    LayerNormBackward(fdx.data(), fdw.data(), fdb.data(), fdy.data(), fi.data(), fw.data(), fm.data(), fr.data(), N,
                      C);
    for (int i = 0; i < N * C; ++i) CHECK(fo[i] == Approx(out[i]).epsilon(1e-5).margin(1e-5));
    for (int i = 0; i < N * C; ++i) CHECK(fdx[i] == Approx(dx[i]).epsilon(1e-4).margin(1e-5));
    for (int c = 0; c < C; ++c) CHECK(fdw[c] == Approx(dw[c]).epsilon(1e-5).margin(1e-5));
  }
  {  // RMS norm and gated GELU, widths with a SIMD tail
    std::mt19937 rng(13);
    const int N = 5, C = 37;
    Vec inp = Random(N * C, rng, 3.0), w = Random(C, rng), dy = Random(N * C, rng);
    Vec out(N * C), rstd(N), dx(N * C, 0), dw(C, 0);
    RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C);
    RmsNormBackward(dx.data(), dw.data(), dy.data(), inp.data(), w.data(), rstd.data(), N, C);
    auto f = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
    std::vector<float> fi = f(inp), fw = f(w), fdy = f(dy), fo(N * C), fr(N), fdx(N * C, 0), fdw(C, 0);
    RmsNormForward(fo.data(), fr.data(), fi.data(), fw.data(), N, C);
    RmsNormBackward(fdx.data(), fdw.data(), fdy.data(), fi.data(), fw.data(), fr.data(), N, C);
    for (int i = 0; i < N * C; ++i) CHECK(fo[i] == Approx(out[i]).epsilon(1e-5).margin(1e-5));
    for (int i = 0; i < N * C; ++i) CHECK(fdx[i] == Approx(dx[i]).epsilon(1e-4).margin(1e-5));
    for (int c = 0; c < C; ++c) CHECK(fdw[c] == Approx(dw[c]).epsilon(1e-4).margin(1e-5));
    const int F = 19;
    Vec gu = Random(N * 2 * F, rng, 2.0), gdy = Random(N * F, rng), gout(N * F), gd(N * 2 * F, 0);
    GatedGeluForward(gout.data(), gu.data(), N, F);
    GatedGeluBackward(gd.data(), gu.data(), gdy.data(), N, F);
    std::vector<float> fgu = f(gu), fgdy = f(gdy), fgo(N * F), fgd(N * 2 * F, 0);
    GatedGeluForward(fgo.data(), fgu.data(), N, F);
    GatedGeluBackward(fgd.data(), fgu.data(), fgdy.data(), N, F);
    for (int i = 0; i < N * F; ++i) CHECK(fgo[i] == Approx(gout[i]).epsilon(1e-5).margin(1e-5));
    for (int i = 0; i < N * 2 * F; ++i) CHECK(fgd[i] == Approx(gd[i]).epsilon(1e-4).margin(1e-5));
  }
  {  // attention, several query blocks and a packed row
    std::mt19937 rng(12);
    const int B = 2, T = 140, C = 16, NH = 2;
    std::vector<int32_t> seg(B * T, -1);
    for (int t = 0; t < 130; ++t) seg[t] = 0;
    for (int t = 0; t < T; ++t) seg[T + t] = t < 100 ? 0 : 1;
    Vec qkv = Random(B * T * 3 * C, rng), dy = Random(B * T * C, rng), out(B * T * C), dqkv(qkv.size(), 0);
    Vec att(AttentionProbsSize(seg.data(), B, T, NH));
    AttentionForward(out.data(), att.data(), qkv.data(), seg.data(), B, T, C, NH);
    AttentionBackward(dqkv.data(), dy.data(), qkv.data(), att.data(), seg.data(), B, T, C, NH);
    std::vector<float> fq(qkv.begin(), qkv.end()), fdy(dy.begin(), dy.end()), fo(out.size()), fd(qkv.size(), 0),
        fa(att.size());
    AttentionForward(fo.data(), fa.data(), fq.data(), seg.data(), B, T, C, NH);
    AttentionBackward(fd.data(), fdy.data(), fq.data(), fa.data(), seg.data(), B, T, C, NH);
    for (size_t i = 0; i < out.size(); ++i) CHECK(fo[i] == Approx(out[i]).epsilon(1e-5).margin(1e-5));
    for (size_t i = 0; i < dqkv.size(); ++i) CHECK(fd[i] == Approx(dqkv[i]).epsilon(1e-4).margin(1e-5));
  }

  std::mt19937 rng(8);
  const int N = 7, C = 16, OC = 9;
  Vec inp = Random(N * C, rng), w = Random(OC * C, rng), out(N * OC);
  std::vector<float> fi(inp.begin(), inp.end()), fw(w.begin(), w.end()), fo(N * OC);
  MatmulForward(out.data(), inp.data(), w.data(), static_cast<const double*>(nullptr), N, C, OC);
  MatmulForward(fo.data(), fi.data(), fw.data(), static_cast<const float*>(nullptr), N, C, OC);
  for (int i = 0; i < N * OC; ++i) CHECK(fo[i] == Approx(out[i]).epsilon(1e-5).margin(1e-5));
}

}  // namespace
}  // namespace dynapipe::runtime::cpu
