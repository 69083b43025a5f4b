#include "runtime/optim/adamw.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

namespace dynapipe::runtime::optim {
namespace {

using Catch::Detail::Approx;

TEST_CASE("AdamW matches a hand computation of two steps") {
  AdamWConfig c;
  c.lr = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.eps = 1e-8;
  c.weight_decay = 0.01;
  std::vector<float> p = {1.0f}, m = {0}, v = {0};
  const std::vector<float> g1 = {0.5f}, g2 = {-0.25f};
  AdamWStep(p, g1, m, v, c, c.lr, 1);
  // Step 1: mhat = g, vhat = g^2 -> update = sign(g) (plus decay).
  const double p1 = 1.0 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.01 * 1.0);
  CHECK(p[0] == Approx(p1).epsilon(1e-6));
  AdamWStep(p, g2, m, v, c, c.lr, 2);
  const double m2 = 0.9 * 0.05 + 0.1 * -0.25, v2 = 0.99 * 0.0025 + 0.01 * 0.0625;
  const double mhat = m2 / (1 - 0.81), vhat = v2 / (1 - 0.9801);
  const double p2 = p1 - 0.1 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.01 * p1);
  CHECK(p[0] == Approx(p2).epsilon(1e-5));
}

TEST_CASE("AdamW minimises a quadratic") {
  std::vector<float> p = {3.0f, -2.0f}, m(2, 0), v(2, 0), g(2);
  AdamWConfig c;
  c.weight_decay = 0;
  for (int step = 1; step <= 2000; ++step) {
    for (int i = 0; i < 2; ++i) g[i] = 2 * (p[i] - (i == 0 ? 1.0f : 0.5f));
    AdamWStep(p, g, m, v, c, 0.01, step);
  }
  CHECK(p[0] == Approx(1.0).margin(1e-2));
  CHECK(p[1] == Approx(0.5).margin(1e-2));
}

TEST_CASE("Learning rate: linear warm-up, cosine decay to min_lr, constant otherwise") {
  proto::OptimizerSpec s;
  s.set_lr(1.0);
  s.mutable_lr_schedule()->set_kind(proto::LrSchedule::cosine);
  s.mutable_lr_schedule()->set_warmup_iters(10);
  s.mutable_lr_schedule()->set_min_lr(0.1);
  s.mutable_lr_schedule()->set_decay_iters(110);
  CHECK(LearningRate(s, 0) == Approx(0.1));
  CHECK(LearningRate(s, 9) == Approx(1.0));
  CHECK(LearningRate(s, 10) == Approx(1.0));
  CHECK(LearningRate(s, 60) == Approx(0.55));  // half way: mean of lr and min_lr
  CHECK(LearningRate(s, 110) == Approx(0.1));
  s.mutable_lr_schedule()->set_kind(proto::LrSchedule::constant);
  CHECK(LearningRate(s, 60) == Approx(1.0));
}

TEST_CASE("Clipping by global norm scales every gradient by one factor") {
  std::vector<float> a = {3, 0}, b = {0, 4};  // norm 5
  std::vector<std::span<const float>> cg = {a, b};
  const double norm = GlobalNorm(cg);
  CHECK(norm == Approx(5.0));
  std::vector<std::span<float>> g = {a, b};
  CHECK(ClipByGlobalNorm(g, 10.0, norm) == 1.0);
  CHECK(a[0] == 3.0f);
  const double f = ClipByGlobalNorm(g, 1.0, norm);
  CHECK(f == Approx(0.2).epsilon(1e-5));
  CHECK(a[0] == Approx(0.6).epsilon(1e-5));
  CHECK(b[1] == Approx(0.8).epsilon(1e-5));
}

}  // namespace
}  // namespace dynapipe::runtime::optim
