// Every op's backward against central finite differences in double
// precision, plus the masking guarantees of attention.
#include "runtime/backend/cpu/ops.h"

#include <catch2/catch.hpp>
#include <functional>
#include <random>
#include <vector>

namespace dynapipe::runtime::cpu {
namespace {

using Catch::Detail::Approx;

using Vec = std::vector<double>;

Vec Random(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Checks d(sum(out * r))/d(x) from `analytic` against central differences of
// `forward` (which recomputes out from the current x). Relative tolerance 1e-6.
void CheckGradient(const char* name, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
  INFO(name);
  REQUIRE(analytic.size() == x.size());
  const double h = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
  }
  CHECK(worst < 1e-6);
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

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
  Vec qkv = Random(B * T * 3 * C, rng), r = Random(B * T * C, rng), out(B * T * C), att(B * NH * T * T);
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

TEST_CASE("Attention: padding never changes a real token; packed samples never see each other") {
  std::mt19937 rng(5);
  const int B = 1, T = 6, C = 4, NH = 1;
  const std::vector<int32_t> packed = {0, 0, 1, 1, 1, -1};
  Vec qkv = Random(T * 3 * C, rng), out(T * C), att(T * T);
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

TEST_CASE("Materialized and varlen attention are bit-identical, forward and backward") {
  // fp32, the training type: masked pairs must contribute exact zeros.
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int B = 3, T = 7, C = 8, NH = 2;
  // A padded row, a packed row ending in padding, and a row of padding only.
  const std::vector<int32_t> seg = {0, 0, 0, 0, -1, -1, -1, 0, 0, 1, 1, 1, 2, -1, -1, -1, -1, -1, -1, -1, -1};
  std::vector<float> qkv(B * T * 3 * C), dout(B * T * C);
  for (auto& x : qkv) x = d(rng);
  for (auto& x : dout) x = d(rng);
  struct Result {
    std::vector<float> out, att, dqkv;
  };
  auto run = [&](AttentionKernel kernel) {
    Result r{std::vector<float>(B * T * C), std::vector<float>(B * NH * T * T), std::vector<float>(qkv.size(), 0.f)};
    AttentionForward(r.out.data(), r.att.data(), qkv.data(), seg.data(), B, T, C, NH, kernel);
    AttentionBackward(r.dqkv.data(), dout.data(), qkv.data(), r.att.data(), seg.data(), B, T, C, NH, kernel);
    return r;
  };
  const Result varlen = run(AttentionKernel::kVarlen);
  const Result materialized = run(AttentionKernel::kMaterialized);
  CHECK(materialized.out == varlen.out);
  CHECK(materialized.att == varlen.att);
  CHECK(materialized.dqkv == varlen.dqkv);
  // Not vacuous: real tokens have non-zero outputs and gradients.
  CHECK(varlen.out[0] != 0.0f);
  CHECK(varlen.dqkv[10 * 3 * C] != 0.0f);  // q of the packed row's second sample, second token
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

TEST_CASE("The float kernels agree with the double ones") {
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
