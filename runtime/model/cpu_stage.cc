#include "runtime/model/cpu_stage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cpu/ops.h"
#include "runtime/optim/adamw.h"

namespace dynapipe::runtime::model {

namespace cpu = ::dynapipe::runtime::cpu;

CpuStageBase::CpuStageBase(GptLayout layout, BufferPool* pool) : layout_(std::move(layout)), pool_(pool) {
  const size_t n = layout_.num_params();
  params_data_.assign(n, 0.0f);
  grads_data_.assign(n, 0.0f);
  owned_ = {ParamRun{0, n}};
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
  layout_.Initialize(params_data_);
}

absl::StatusOr<Buffer> CpuStageBase::Get(int64_t floats) {
  return pool_->Get(static_cast<size_t>(floats) * sizeof(float));
}

absl::Status CpuStageBase::ZeroGrads() {
  std::fill(grads_data_.begin(), grads_data_.end(), 0.0f);
  return absl::OkStatus();
}

absl::Status CpuStageBase::AddGradSumOfSquares(double* sum) {
  for (const ParamRun& r : layout_.NormRuns()) {
    for (size_t i = r.offset; i < r.offset + r.size; ++i) *sum += static_cast<double>(grads_data_[i]) * grads_data_[i];
  }
  return absl::OkStatus();
}

absl::Status CpuStageBase::GradSumsOfSquares(std::span<const ParamRun> pieces, std::span<double> out) {
  if (out.size() != pieces.size()) return absl::InvalidArgumentError("GradSumsOfSquares: one sum per piece");
  const std::vector<ParamRun> norm = layout_.NormRuns();
  for (size_t i = 0; i < pieces.size(); ++i) {
    double sum = 0;
    for (const ParamRun& r : norm) {
      const size_t lo = std::max(r.offset, pieces[i].offset);
      const size_t hi = std::min(r.offset + r.size, pieces[i].offset + pieces[i].size);
      for (size_t k = lo; k < hi; ++k) sum += static_cast<double>(grads_data_[k]) * grads_data_[k];
    }
    out[i] = sum;
  }
  return absl::OkStatus();
}

absl::Status CpuStageBase::ShardOptimizer(std::span<const ParamRun> owned) {
  size_t total = 0, end = 0;
  for (const ParamRun& r : owned) {
    if (r.offset < end || r.offset + r.size > layout_.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat("ShardOptimizer: run [", r.offset, ", ", r.offset + r.size,
                                                     ") overlaps or lies outside the stage's ",
                                                     layout_.num_params(), " parameters"));
    }
    end = r.offset + r.size;
    total += r.size;
  }
  owned_.assign(owned.begin(), owned.end());
  m_.assign(total, 0.0f);
  v_.assign(total, 0.0f);
  return absl::OkStatus();
}

absl::Status CpuStageBase::OptimizerStep(const OptimizerStepArgs& args) {
  if (args.grad_scale != 1.0) {
    for (float& x : grads_data_) x = static_cast<float>(x * args.grad_scale);
  }
  optim::AdamWConfig no_decay = args.adamw;
  no_decay.weight_decay = 0;
  // Each parameter's owned part; moments are packed in owned order.
  size_t moment = 0;
  for (const ParamRun& r : owned_) {
    for (const ParamInfo& p : layout_.params()) {
      const size_t lo = std::max(r.offset, p.offset), hi = std::min(r.offset + r.size, p.offset + p.size);
      if (lo >= hi) continue;
      const size_t at = moment + (lo - r.offset), n = hi - lo;
      optim::AdamWStep(std::span<float>(params_data_).subspan(lo, n), std::span<float>(grads_data_).subspan(lo, n),
                       std::span<float>(m_).subspan(at, n), std::span<float>(v_).subspan(at, n),
                       p.decay ? args.adamw : no_decay, args.lr, args.step);
    }
    moment += r.size;
  }
  return absl::OkStatus();
}

absl::Status CpuStageBase::ExportState(StageState* out) {
  out->params = params_data_;
  out->adam_m.assign(layout_.num_params(), 0.0f);
  out->adam_v.assign(layout_.num_params(), 0.0f);
  size_t moment = 0;
  for (const ParamRun& r : owned_) {
    std::copy_n(m_.begin() + moment, r.size, out->adam_m.begin() + r.offset);
    std::copy_n(v_.begin() + moment, r.size, out->adam_v.begin() + r.offset);
    moment += r.size;
  }
  return absl::OkStatus();
}

absl::Status CpuStageBase::ImportState(const StageState& in) {
  const size_t n = layout_.num_params();
  if (in.params.size() != n || in.adam_m.size() != n || in.adam_v.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("stage state of ", in.params.size(), "/", in.adam_m.size(), "/",
                                                   in.adam_v.size(), " values for a stage of ", n, " parameters"));
  }
  params_data_ = in.params;
  size_t moment = 0;
  for (const ParamRun& r : owned_) {
    std::copy_n(in.adam_m.begin() + r.offset, r.size, m_.begin() + moment);
    std::copy_n(in.adam_v.begin() + r.offset, r.size, v_.begin() + moment);
    moment += r.size;
  }
  return absl::OkStatus();
}

void CpuStageBase::NormForward(float* out, float* mean, float* rstd, const float* x, size_t w, size_t b, int64_t N) {
  const int64_t C = config().hidden;
  if (config().norm == NormKind::kRms) {
    cpu::RmsNormForward(out, rstd, x, P(w), N, C, config().NormEps());
  } else {
    cpu::LayerNormForward(out, mean, rstd, x, P(w), P(b), N, C, config().NormEps());
  }
}

void CpuStageBase::NormBackward(float* dx, size_t w, size_t b, const float* dout, const float* x, const float* mean,
                            const float* rstd, int64_t N) {
  const int64_t C = config().hidden;
  if (config().norm == NormKind::kRms) {
    cpu::RmsNormBackward(dx, G(w), dout, x, P(w), rstd, N, C);
  } else {
    cpu::LayerNormBackward(dx, G(w), G(b), dout, x, P(w), mean, rstd, N, C);
  }
}

void CpuStageBase::ActivationForward(float* act, const float* fc, int64_t N) {
  const int64_t F = config().ffn;
  switch (config().mlp) {
    case MlpKind::kGelu: cpu::GeluForward(act, fc, N * F); break;
    case MlpKind::kRelu: cpu::ReluForward(act, fc, N * F); break;
    case MlpKind::kGatedGelu: cpu::GatedGeluForward(act, fc, N, F); break;
    case MlpKind::kSwiglu: cpu::SwigluForward(act, fc, N, F); break;
  }
}

void CpuStageBase::ActivationBackward(float* dfc, const float* fc, const float* dact, int64_t N) {
  const int64_t F = config().ffn;
  switch (config().mlp) {
    case MlpKind::kGelu: cpu::GeluBackward(dfc, fc, dact, N * F); break;
    case MlpKind::kRelu: cpu::ReluBackward(dfc, fc, dact, N * F); break;
    case MlpKind::kGatedGelu: cpu::GatedGeluBackward(dfc, fc, dact, N, F); break;
    case MlpKind::kSwiglu: cpu::SwigluBackward(dfc, fc, dact, N, F); break;
  }
}

absl::StatusOr<double> CpuStageBase::TakeLoss() {
  const double loss = loss_total_;
  loss_total_ = 0;
  return loss;
}

}  // namespace dynapipe::runtime::model
