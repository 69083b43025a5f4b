#include "benchmarks/op_timings.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <span>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cpu/ops.h"
#include "src/common/stats.h"
#include "src/common/status_macros.h"

namespace dynapipe::benchmarks {

namespace {

namespace cpu = runtime::cpu;
using Clock = std::chrono::steady_clock;
using runtime::model::TokenBatch;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One micro-batch's shapes.
struct Shape {
  const TokenBatch* batch;
  int64_t B, T, N, M;
  std::vector<int32_t> scored_targets;  // (M)
};

struct Op {
  std::string name;
  std::function<void(const Shape&)> fwd;
  std::function<void(const Shape&)> between;  // untimed (e.g. zeroing what backward accumulates into)
  std::function<void(const Shape&)> bwd;      // null: forward only
};

class Timer {
 public:
  Timer(const std::vector<Shape>& shapes, int reps) : shapes_(shapes), reps_(reps) {}

  void Run(const Op& op, std::vector<OpTiming>* out) const {
    std::vector<double> fwd, bwd;
    for (int rep = -1; rep < reps_; ++rep) {  // rep -1 warms up
      double f = 0, b = 0;
      for (const Shape& s : shapes_) {
        auto t = Clock::now();
        op.fwd(s);
        f += Since(t);
        if (!op.bwd) continue;
        if (op.between) op.between(s);
        t = Clock::now();
        op.bwd(s);
        b += Since(t);
      }
      if (rep < 0) continue;
      fwd.push_back(f);
      bwd.push_back(b);
    }
    const int calls = static_cast<int>(shapes_.size());
    if (!op.bwd) {
      out->push_back({op.name, Median(fwd), calls});
      return;
    }
    out->push_back({op.name + "_fwd", Median(fwd), calls});
    out->push_back({op.name + "_bwd", Median(bwd), calls});
  }

 private:
  const std::vector<Shape>& shapes_;
  int reps_;
};

std::vector<float> Random(size_t n, float mean, float std, std::mt19937_64& rng) {
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void Zero(std::vector<float>& v, size_t n) { std::memset(v.data(), 0, n * sizeof(float)); }

// The shapes of the micro-batches of the chosen iterations.
absl::StatusOr<std::vector<Shape>> ShapesOf(const BatchDump& dump, const std::vector<int>& iterations) {
  std::vector<Shape> shapes;
  for (int i : iterations) {
    if (i < 0 || i >= static_cast<int>(dump.iterations.size())) {
      return absl::InvalidArgumentError(absl::StrCat("op iterations: the dump has no iteration ", i));
    }
    for (const TokenBatch& b : dump.iterations[i].batches) {
      Shape s{&b, b.rows, b.seq, b.rows * b.seq, 0, {}};
      for (int32_t t : b.targets) {
        if (t >= 0) s.scored_targets.push_back(t);
      }
      s.M = static_cast<int64_t>(s.scored_targets.size());
      shapes.push_back(std::move(s));
    }
  }
  if (shapes.empty()) return absl::InvalidArgumentError("op iterations: no micro-batches");
  return shapes;
}

// The model's dimensions the ops run at.
struct Dims {
  int64_t C, F, V, NH;
};

// Buffers big enough for every shape: inputs and weights random (GPT-2-like
// scales), outputs and gradients scratch.
struct Buffers {
  std::vector<float> in, dout, out, dinp, w, bias, dw, dbias, mean, rstd, ln_w, att, qkv, dqkv;
};

// Draws from `rng` in a fixed order, so the data is the same for a seed.
Buffers MakeBuffers(const std::vector<Shape>& shapes, const Dims& d, std::mt19937_64& rng) {
  int64_t max_n = 0, max_att = 0;
  for (const Shape& s : shapes) {
    max_n = std::max(max_n, s.N);
    max_att = std::max(max_att, s.B * d.NH * s.T * s.T);
  }
  const int64_t wide = std::max({3 * d.C, d.F, d.V});
  Buffers b;
  b.in = Random(max_n * wide, 0, 1, rng);
  b.dout = Random(max_n * wide, 0, 1, rng);
  b.out.resize(max_n * wide);
  b.dinp.resize(max_n * wide);
  b.w = Random(wide * std::max(d.C, d.F), 0, 0.02f, rng);
  b.bias = Random(wide, 0, 0.02f, rng);
  b.dw.resize(b.w.size());
  b.dbias.resize(b.bias.size());
  b.mean.resize(max_n);
  b.rstd.resize(max_n);
  b.ln_w = Random(d.C, 1, 0.1f, rng);
  b.att.resize(max_att);
  b.qkv = Random(max_n * 3 * d.C, 0, 1, rng);
  b.dqkv.resize(max_n * 3 * d.C);
  return b;
}

// The five matmuls of a layer and the LM head (no bias).
void TimeMatmuls(const Timer& timer, Buffers& x, const Dims& d, std::vector<OpTiming>* result) {
  auto matmul = [&](const std::string& name, int64_t ic, int64_t oc, bool head) {
    const float* b = head ? nullptr : x.bias.data();
    float* db = head ? nullptr : x.dbias.data();
    auto rows = [head](const Shape& s) { return head ? s.M : s.N; };
    timer.Run({name,
               [&, b, ic, oc, rows](const Shape& s) {
                 cpu::MatmulForward(x.out.data(), x.in.data(), x.w.data(), b, rows(s), ic, oc);
               },
               nullptr,
               [&, db, ic, oc, rows](const Shape& s) {
                 cpu::MatmulBackward(x.dinp.data(), x.dw.data(), db, x.dout.data(), x.in.data(), x.w.data(), rows(s),
                                     ic, oc);
               }},
              result);
  };
  matmul("matmul_qkv", d.C, 3 * d.C, false);
  matmul("matmul_proj", d.C, d.C, false);
  matmul("matmul_fc", d.C, d.F, false);
  matmul("matmul_mproj", d.F, d.C, false);
  matmul("matmul_head", d.C, d.V, true);
}

// LayerNorm, GELU, both attention kernels and the cross-entropy.
void TimePointwiseAndAttention(const Timer& timer, Buffers& x, const Dims& d, std::vector<OpTiming>* result) {
  const int64_t C = d.C, F = d.F, V = d.V, NH = d.NH;
  timer.Run({"layernorm",
             [&](const Shape& s) {
               cpu::LayerNormForward(x.out.data(), x.mean.data(), x.rstd.data(), x.in.data(), x.ln_w.data(),
                                     x.bias.data(), s.N, C);
             },
             nullptr,
             [&](const Shape& s) {
               cpu::LayerNormBackward(x.dinp.data(), x.dw.data(), x.dbias.data(), x.dout.data(), x.in.data(),
                                      x.ln_w.data(), x.mean.data(), x.rstd.data(), s.N, C);
             }},
            result);
  timer.Run({"gelu", [&](const Shape& s) { cpu::GeluForward(x.out.data(), x.in.data(), s.N * F); },
             [&](const Shape& s) { Zero(x.dinp, s.N * F); },
             [&](const Shape& s) { cpu::GeluBackward(x.dinp.data(), x.in.data(), x.dout.data(), s.N * F); }},
            result);
  for (const auto kernel : {cpu::AttentionKernel::kVarlen, cpu::AttentionKernel::kMaterialized}) {
    const std::string name =
        kernel == cpu::AttentionKernel::kVarlen ? "attention_varlen" : "attention_materialized";
    timer.Run({name,
               [&, kernel](const Shape& s) {
                 cpu::AttentionForward(x.out.data(), x.att.data(), x.qkv.data(), s.batch->segments.data(), s.B, s.T,
                                       C, NH, kernel);
               },
               [&](const Shape& s) { Zero(x.dqkv, s.N * 3 * C); },
               [&, kernel](const Shape& s) {
                 cpu::AttentionBackward(x.dqkv.data(), x.dout.data(), x.qkv.data(), x.att.data(),
                                        s.batch->segments.data(), s.B, s.T, C, NH, kernel);
               }},
              result);
  }
  timer.Run({"crossentropy",
             [&](const Shape& s) {
               cpu::CrossEntropyForward(x.dinp.data(), x.in.data(), s.scored_targets.data(), 1.0f / 8192, s.M, V);
             },
             [&](const Shape& s) { Zero(x.out, s.M * V); },
             [&](const Shape& s) {
               cpu::CrossEntropyBackward(x.out.data(), x.dinp.data(), s.scored_targets.data(), 1.0f / 8192, s.M, V);
             }},
            result);
}

// AdamW over the whole one-stage model, as GptStage::OptimizerStep runs it,
// once per chosen iteration.
absl::Status TimeAdamW(const BatchDump& dump, const OpTimingOptions& options, const Shape& any_shape,
                       std::mt19937_64& rng, std::vector<OpTiming>* result) {
  runtime::model::StageOptions so;
  so.num_layers = dump.config.num_layers;
  ASSIGN_OR_RETURN(const runtime::model::GptLayout layout, runtime::model::GptLayout::Make(dump.config, so));
  const size_t np = layout.num_params();
  std::vector<float> params = Random(np, 0, 0.02f, rng), grads = Random(np, 0, 1e-3f, rng), m(np), v(np);
  runtime::optim::AdamWConfig no_decay = dump.adamw;
  no_decay.weight_decay = 0;
  std::vector<Shape> per_iteration(options.iterations.size(), any_shape);
  int64_t step = 0;
  Timer(per_iteration, options.reps)
      .Run({"adamw",
            [&](const Shape&) {
              ++step;
              for (const runtime::model::ParamInfo& p : layout.params()) {
                auto span = [&](std::vector<float>& x) { return std::span<float>(x).subspan(p.offset, p.size); };
                runtime::optim::AdamWStep(span(params), span(grads), span(m), span(v),
                                          p.decay ? dump.adamw : no_decay, dump.adamw.lr, step);
              }
            },
            nullptr, nullptr},
           result);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<OpTiming>> TimeOps(const BatchDump& dump, const OpTimingOptions& options) {
  const auto& cfg = dump.config;
  const Dims dims{cfg.hidden, cfg.ffn, cfg.vocab, cfg.heads};
  ASSIGN_OR_RETURN(const std::vector<Shape> shapes, ShapesOf(dump, options.iterations));
  std::mt19937_64 rng(options.seed);
  Buffers buffers = MakeBuffers(shapes, dims, rng);
  std::vector<OpTiming> result;
  const Timer timer(shapes, options.reps);
  TimeMatmuls(timer, buffers, dims, &result);
  TimePointwiseAndAttention(timer, buffers, dims, &result);
  RETURN_IF_ERROR(TimeAdamW(dump, options, shapes.front(), rng, &result));
  return result;
}

}  // namespace dynapipe::benchmarks
