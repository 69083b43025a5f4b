#pragma once

// AdamW (decoupled weight decay), the learning-rate schedule (linear warm-up,
// cosine decay to min_lr) and gradient clipping by global norm, on fp32
// parameters. The CUDA backend keeps the same semantics with fp32 master
// weights.

#include <cstdint>
#include <span>

#include "proto/job.pb.h"
#include "src/spec/job_spec.h"

namespace dynapipe::runtime::optim {

struct AdamWConfig {
  double lr = spec::kDefaultLr, beta1 = spec::kDefaultBeta1, beta2 = spec::kDefaultBeta2, eps = spec::kDefaultEps,
         weight_decay = spec::kDefaultWeightDecay;
};

// The optimizer settings of a normalised spec (spec::NormalizeJobSpec).
AdamWConfig FromSpec(const proto::OptimizerSpec& spec);

// Learning rate at `step` (0-based) under a normalised spec's schedule.
double LearningRate(const proto::OptimizerSpec& spec, int64_t step);

// sqrt(sum of squares) over every gradient span.
double GlobalNorm(std::span<const std::span<const float>> grads);

// The clipping factor: max_norm / (norm + 1e-6) when max_norm > 0 and the
// norm exceeds it, else 1.
double ClipFactor(double max_norm, double norm);

// Scales every gradient by ClipFactor (each x becomes float(x * factor));
// returns the factor.
double ClipByGlobalNorm(std::span<const std::span<float>> grads, double max_norm, double norm);

// One AdamW update of `params` in place; `m` and `v` are the moment buffers
// (zero before the first step), `step` counts from 1.
void AdamWStep(std::span<float> params, std::span<const float> grads, std::span<float> m, std::span<float> v,
               const AdamWConfig& c, double lr, int64_t step);

}  // namespace dynapipe::runtime::optim
