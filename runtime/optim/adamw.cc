#include "runtime/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "src/common/simd_clones.h"

namespace dynapipe::runtime::optim {

AdamWConfig FromSpec(const proto::OptimizerSpec& s) {
  AdamWConfig c;
  c.lr = s.lr();
  c.beta1 = s.beta1();
  c.beta2 = s.beta2();
  c.eps = s.eps();
  c.weight_decay = s.weight_decay();
  return c;
}

double LearningRate(const proto::OptimizerSpec& spec, int64_t step) {
  const double lr = spec.lr();
  const auto& sched = spec.lr_schedule();
  if (sched.kind() != proto::LrSchedule::cosine) return lr;
  const int64_t warmup = std::max<int64_t>(0, sched.warmup_iters());
  if (step < warmup) return lr * static_cast<double>(step + 1) / warmup;
  const int64_t decay = sched.decay_iters();
  if (step >= decay) return sched.min_lr();
  const double progress = static_cast<double>(step - warmup) / std::max<int64_t>(1, decay - warmup);
  return sched.min_lr() + 0.5 * (lr - sched.min_lr()) * (1 + std::cos(M_PI * progress));
}

double GlobalNorm(std::span<const std::span<const float>> grads) {
  double sum = 0;
  for (auto g : grads) {
    for (float x : g) sum += static_cast<double>(x) * x;
  }
  return std::sqrt(sum);
}

double ClipFactor(double max_norm, double norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

double ClipByGlobalNorm(std::span<const std::span<float>> grads, double max_norm, double norm) {
  const double f = ClipFactor(max_norm, norm);
  if (f == 1.0) return f;
  for (auto g : grads) {
    for (float& x : g) x = static_cast<float>(x * f);
  }
  return f;
}

namespace {

// The element loop, vectorised per clone (double arithmetic as before).
DP_SIMD_CLONES void AdamWLoop(float* __restrict params, const float* __restrict grads, float* __restrict m,
                              float* __restrict v, size_t n, double beta1, double beta2, double eps,
                              double weight_decay, double lr, double bc1, double bc2) {
  for (size_t i = 0; i < n; ++i) {
    const double g = grads[i];
    m[i] = static_cast<float>(beta1 * m[i] + (1 - beta1) * g);
    v[i] = static_cast<float>(beta2 * v[i] + (1 - beta2) * g * g);
    const double mhat = m[i] / bc1, vhat = v[i] / bc2;
    params[i] = static_cast<float>(params[i] - lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * params[i]));
  }
}

}  // namespace

void AdamWStep(std::span<float> params, std::span<const float> grads, std::span<float> m, std::span<float> v,
               const AdamWConfig& c, double lr, int64_t step) {
  const double bc1 = 1 - std::pow(c.beta1, step), bc2 = 1 - std::pow(c.beta2, step);
  AdamWLoop(params.data(), grads.data(), m.data(), v.data(), params.size(), c.beta1, c.beta2, c.eps, c.weight_decay,
            lr, bc1, bc2);
}

}  // namespace dynapipe::runtime::optim
