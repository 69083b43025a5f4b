#include "src/spec/job_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"

namespace dynapipe::spec {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// An integer field: 0 takes `def` (when def > 0), then it must lie in [lo, hi].
template <typename T, typename Set>
absl::Status Int(absl::string_view field, T value, T def, T lo, T hi, Set set) {
  if (value == 0 && def > 0) value = def;
  if (value < lo || value > hi) return Bad(field, absl::StrCat("must be in ", lo, "..", hi, ", got ", value));
  set(value);
  return absl::OkStatus();
}

// A real field: finite, 0 takes `def` (when def > 0), then in [lo, hi].
template <typename Set>
absl::Status Real(absl::string_view field, double value, double def, double lo, double hi, Set set) {
  if (!std::isfinite(value)) return Bad(field, absl::StrCat("must be a finite number, got ", value));
  if (value == 0 && def > 0) value = def;
  if (value < lo || value > hi) return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
  set(value);
  return absl::OkStatus();
}

// An enum field: a value the proto declares; unspecified (0) takes `def`.
template <typename E>
absl::Status Enum(absl::string_view field, E value, E def, bool (*valid)(int), E* out) {
  if (!valid(static_cast<int>(value))) return Bad(field, absl::StrCat("unknown value ", static_cast<int>(value)));
  *out = static_cast<int>(value) == 0 ? def : value;
  return absl::OkStatus();
}

// Well-formed UTF-8 (RFC 3629: shortest forms, no surrogates, at most
// U+10FFFF), as protobuf requires of a string field on the wire.
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int more = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      more = 1, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      more = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(more)) return false;
    for (int k = 1; k <= more; ++k) {
      const unsigned char t = s[i + k];
      if ((t & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += more + 1;
  }
  return true;
}

// Text a job carries: UTF-8 without control characters (it reaches logs,
// status pages and the wire).
absl::Status Text(absl::string_view field, absl::string_view s) {
  if (!IsUtf8(s)) return Bad(field, "not valid UTF-8");
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return Bad(field, "contains a control character");
  }
  return absl::OkStatus();
}

// A name: bounded text.
absl::Status Name(absl::string_view field, const std::string& s) {
  if (s.size() > kMaxNameBytes) {
    return Bad(field, absl::StrCat("longer than ", kMaxNameBytes, " bytes (", s.size(), ")"));
  }
  return Text(field, s);
}

// model.block: the kind's defaults written out (job_spec.h), then checked.
absl::Status NormalizeBlock(proto::ModelKind::Value kind, int head_size, proto::BlockSpec* block) {
  const bool t5 = kind == proto::ModelKind::t5, llama = kind == proto::ModelKind::llama;
  proto::NormKind::Value norm{};
  RETURN_IF_ERROR(Enum("model.block.norm", block->norm(),
                       t5 ? kDefaultT5Norm : (llama ? kDefaultLlamaNorm : kDefaultGptNorm),
                       proto::NormKind::Value_IsValid, &norm));
  block->set_norm(norm);
  proto::MlpKind::Value mlp{};
  RETURN_IF_ERROR(Enum("model.block.mlp", block->mlp(), t5 ? kDefaultT5Mlp : (llama ? kDefaultLlamaMlp : kDefaultGptMlp),
                       proto::MlpKind::Value_IsValid, &mlp));
  block->set_mlp(mlp);
  if (!block->has_bias()) block->set_bias(t5 ? kDefaultT5Bias : (llama ? kDefaultLlamaBias : kDefaultGptBias));
  proto::PositionKind::Value positions{};
  if (t5) {
    if (block->positions() != proto::PositionKind::unspecified) {
      return Bad("model.block.positions", "T5 stages place tokens by their relative position bias");
    }
  } else {
    RETURN_IF_ERROR(Enum("model.block.positions", block->positions(),
                         llama ? proto::PositionKind::rotary : proto::PositionKind::learned,
                         proto::PositionKind::Value_IsValid, &positions));
    block->set_positions(positions);
    if (positions == proto::PositionKind::rotary && head_size % 2 != 0) {
      return Bad("model.block.positions", absl::StrCat("rotary positions need an even head size, got ", head_size));
    }
  }
  const double eps = llama ? kDefaultLlamaNormEps
                           : (norm == proto::NormKind::rmsnorm ? kDefaultRmsNormEps : kDefaultLayerNormEps);
  RETURN_IF_ERROR(Real("model.block.norm_eps", block->has_norm_eps() ? block->norm_eps() : 0.0, eps, 1e-12, 1.0,
                       [&](double v) { block->set_norm_eps(v); }));
  if (positions == proto::PositionKind::rotary) {
    RETURN_IF_ERROR(Real("model.block.rope_base", block->has_rope_base() ? block->rope_base() : 0.0, kDefaultRopeBase,
                         1.0, 1e12, [&](double v) { block->set_rope_base(v); }));
  } else if (block->has_rope_base()) {
    return Bad("model.block.rope_base", "only rotary positions have a base");
  }
  return absl::OkStatus();
}

absl::Status NormalizeModel(proto::ModelSpec* m) {
  RETURN_IF_ERROR(Name("model.name", m->name()));
  proto::ModelKind::Value kind{};
  RETURN_IF_ERROR(Enum("model.kind", m->kind(), proto::ModelKind::unspecified, proto::ModelKind::Value_IsValid, &kind));
  if (kind == proto::ModelKind::unspecified) return Bad("model.kind", "must be gpt, t5 or llama");
  const bool t5 = kind == proto::ModelKind::t5;
  RETURN_IF_ERROR(Int("model.num_layers", m->num_layers(), 0, 1, kMaxLayers, [&](int v) { m->set_num_layers(v); }));
  if (t5) {
    RETURN_IF_ERROR(Int("model.num_decoder_layers", m->num_decoder_layers(), 0, 1, kMaxLayers,
                        [&](int v) { m->set_num_decoder_layers(v); }));
  } else if (m->num_decoder_layers() != 0) {
    return Bad("model.num_decoder_layers", "only t5 models have decoder layers");
  }
  RETURN_IF_ERROR(Int("model.hidden", m->hidden(), 0, 1, kMaxHidden, [&](int v) { m->set_hidden(v); }));
  RETURN_IF_ERROR(Int("model.heads", m->heads(), 0, 1, kMaxHeads, [&](int v) { m->set_heads(v); }));
  if (m->hidden() % m->heads() != 0) {
    return Bad("model.heads", absl::StrCat(m->heads(), " does not divide model.hidden ", m->hidden()));
  }
  RETURN_IF_ERROR(Int("model.kv_heads", m->kv_heads(), m->heads(), 1, m->heads(), [&](int v) { m->set_kv_heads(v); }));
  if (m->heads() % m->kv_heads() != 0) {
    return Bad("model.kv_heads", absl::StrCat(m->kv_heads(), " does not divide model.heads ", m->heads()));
  }
  if (t5 && m->kv_heads() != m->heads()) return Bad("model.kv_heads", "T5 stages have one key and value head per head");
  RETURN_IF_ERROR(Int("model.ffn", m->ffn(), std::min(kMaxFfn, 4 * m->hidden()), 1, kMaxFfn,
                      [&](int v) { m->set_ffn(v); }));
  RETURN_IF_ERROR(Int("model.vocab", m->vocab(), 0, 1, kMaxVocab, [&](int v) { m->set_vocab(v); }));
  // max_positions takes its default from batching (NormalizeJobSpec).
  if (m->max_positions() < 0 || m->max_positions() > kMaxPositions) {
    return Bad("model.max_positions", absl::StrCat("must be in 1..", kMaxPositions, ", got ", m->max_positions()));
  }
  proto::DType::Value dtype{};
  RETURN_IF_ERROR(Enum("model.dtype", m->dtype(), proto::DType::unspecified, proto::DType::Value_IsValid, &dtype));
  if (dtype == proto::DType::int32) return Bad("model.dtype", "int32 is not a compute type (fp32, bf16, fp16)");
  // unspecified stays: the executing backend's own type.
  proto::AttentionKernel::Value attention{};
  RETURN_IF_ERROR(Enum("model.attention", m->attention(), kDefaultAttention,
                       proto::AttentionKernel::Value_IsValid, &attention));
  m->set_attention(attention);
  return NormalizeBlock(kind, m->hidden() / m->heads(), m->mutable_block());
}

absl::Status NormalizeParallelism(const proto::ModelSpec& model, proto::ParallelismSpec* p) {
  RETURN_IF_ERROR(Int("parallelism.pp", p->pp(), kDefaultPp, 1, kMaxPp, [&](int v) { p->set_pp(v); }));
  RETURN_IF_ERROR(Int("parallelism.dp", p->dp(), kDefaultDp, 1, kMaxDp, [&](int v) { p->set_dp(v); }));
  if (int64_t{p->pp()} * p->dp() > kMaxWorld) {
    return Bad("parallelism", absl::StrCat("pp x dp = ", int64_t{p->pp()} * p->dp(), " ranks exceeds ", kMaxWorld));
  }
  RETURN_IF_ERROR(Real("parallelism.grad_bucket_mb", p->grad_bucket_mb(), kDefaultGradBucketMb, 1e-6,
                       kMaxGradBucketMb, [&](double v) { p->set_grad_bucket_mb(v); }));
  const int layers = model.num_layers() + model.num_decoder_layers();
  if (p->layer_to_device_size() != 0 && p->layer_to_device_size() != layers) {
    return Bad("parallelism.layer_to_device",
               absl::StrCat("has ", p->layer_to_device_size(), " entries for a model of ", layers, " layers"));
  }
  for (int i = 0; i < p->layer_to_device_size(); ++i) {
    if (p->layer_to_device(i) < 0 || p->layer_to_device(i) >= p->pp()) {
      return Bad(absl::StrCat("parallelism.layer_to_device[", i, "]"),
                 absl::StrCat("device ", p->layer_to_device(i), " outside 0..", p->pp() - 1));
    }
  }
  return absl::OkStatus();
}

absl::Status NormalizeBatching(proto::ModelSpec* model, proto::BatchingSpec* b) {
  proto::BatchingSpec::Method method{};
  RETURN_IF_ERROR(Enum("batching.method", b->method(), proto::BatchingSpec::dynamic,
                       proto::BatchingSpec::Method_IsValid, &method));
  b->set_method(method);
  RETURN_IF_ERROR(Int<int64_t>("batching.global_batch_tokens", b->global_batch_tokens(), kDefaultGlobalBatchTokens, 1,
                               kMaxBatchTokens, [&](int64_t v) { b->set_global_batch_tokens(v); }));
  const int max_positions = model->max_positions();
  const int default_seq = max_positions > 0 ? std::min(kDefaultMaxSeqLen, max_positions) : kDefaultMaxSeqLen;
  RETURN_IF_ERROR(Int("batching.max_seq_len", b->max_seq_len(), default_seq, 1, kMaxPositions,
                      [&](int v) { b->set_max_seq_len(v); }));
  if (max_positions == 0) model->set_max_positions(b->max_seq_len());
  if (b->max_seq_len() > model->max_positions()) {
    return Bad("batching.max_seq_len",
               absl::StrCat(b->max_seq_len(), " exceeds model.max_positions ", model->max_positions()));
  }
  RETURN_IF_ERROR(Int("batching.round_multiple", b->round_multiple(), kDefaultRoundMultiple, 1, 4096,
                      [&](int v) { b->set_round_multiple(v); }));
  // Sample lengths are rounded up to the multiple: the longest must still fit.
  const int r = b->round_multiple();
  const int64_t rounded = (int64_t{b->max_seq_len()} + r - 1) / r * r;
  if (rounded > model->max_positions()) {
    const int fits = model->max_positions() / r * r;
    return Bad("batching.round_multiple",
               absl::StrCat(r, " rounds a sample of batching.max_seq_len ", b->max_seq_len(), " tokens up to ", rounded,
                            ", past model.max_positions ", model->max_positions(),
                            fits > 0 ? absl::StrCat(" (lower max_seq_len to ", fits, ", or use a multiple dividing ",
                                                    model->max_positions(), ")")
                                     : ""));
  }
  // 0 stays: the planner tries every power of two that fits.
  RETURN_IF_ERROR(Int("batching.micro_batch_size", b->micro_batch_size(), 0, 0, kMaxMicroBatchSize,
                      [&](int v) { b->set_micro_batch_size(v); }));
  RETURN_IF_ERROR(Int<int64_t>("batching.micro_batch_tokens", b->micro_batch_tokens(), 0, 0, kMaxBatchTokens,
                               [&](int64_t v) { b->set_micro_batch_tokens(v); }));
  RETURN_IF_ERROR(Real("batching.cap_tolerance", b->cap_tolerance(), kDefaultCapTolerance, 0, 1,
                       [&](double v) { b->set_cap_tolerance(v); }));
  RETURN_IF_ERROR(Int("batching.dp_candidates", b->dp_candidates(), kDefaultDpCandidates, 1, kMaxCandidates,
                      [&](int v) { b->set_dp_candidates(v); }));
  return absl::OkStatus();
}

absl::Status NormalizeSchedule(proto::ScheduleSpec* s) {
  proto::ScheduleSpec::Policy policy{};
  RETURN_IF_ERROR(Enum("schedule.policy", s->policy(), proto::ScheduleSpec::auto_, proto::ScheduleSpec::Policy_IsValid,
                       &policy));
  s->set_policy(policy);
  proto::RecomputeLevel::Value recompute{};
  RETURN_IF_ERROR(Enum("schedule.recompute", s->recompute(), proto::RecomputeLevel::auto_,
                       proto::RecomputeLevel::Value_IsValid, &recompute));
  s->set_recompute(recompute);
  return Int("schedule.permutations", s->permutations(), kDefaultPermutations, 1, kMaxCandidates,
             [&](int v) { s->set_permutations(v); });
}

absl::Status NormalizeCostRefit(proto::CostRefitSpec* r) {
  proto::CostRefitSpec::Mode mode{};
  RETURN_IF_ERROR(Enum("cost_refit.mode", r->mode(), kDefaultCostRefit, proto::CostRefitSpec::Mode_IsValid, &mode));
  r->set_mode(mode);
  RETURN_IF_ERROR(Int("cost_refit.window", r->window(), kDefaultRefitWindow, 1, 1024, [&](int v) { r->set_window(v); }));
  RETURN_IF_ERROR(Int("cost_refit.min_iterations", r->min_iterations(), kDefaultRefitMinIterations, 1, r->window(),
                      [&](int v) { r->set_min_iterations(v); }));
  return Real("cost_refit.max_step", r->max_step(), kDefaultRefitMaxStep, 1, 1000,
              [&](double v) { r->set_max_step(v); });
}

absl::Status NormalizeOptimizer(int64_t iterations, proto::OptimizerSpec* o) {
  RETURN_IF_ERROR(Real("optimizer.lr", o->lr(), kDefaultLr, 1e-12, kMaxLr, [&](double v) { o->set_lr(v); }));
  // 0 cannot be asked for: in proto3 it means "the default".
  RETURN_IF_ERROR(Real("optimizer.beta1", o->beta1(), kDefaultBeta1, 0, 0.999999, [&](double v) { o->set_beta1(v); }));
  RETURN_IF_ERROR(Real("optimizer.beta2", o->beta2(), kDefaultBeta2, 0, 0.999999, [&](double v) { o->set_beta2(v); }));
  RETURN_IF_ERROR(Real("optimizer.eps", o->eps(), kDefaultEps, 1e-30, 1, [&](double v) { o->set_eps(v); }));
  RETURN_IF_ERROR(Real("optimizer.weight_decay", o->weight_decay(), kDefaultWeightDecay, 0, kMaxWeightDecay,
                       [&](double v) { o->set_weight_decay(v); }));
  RETURN_IF_ERROR(Real("optimizer.grad_clip", o->grad_clip(), 0, 0, 1e12, [&](double v) { o->set_grad_clip(v); }));
  proto::LrSchedule* s = o->mutable_lr_schedule();
  proto::LrSchedule::Kind kind{};
  RETURN_IF_ERROR(
      Enum("optimizer.lr_schedule.kind", s->kind(), proto::LrSchedule::constant, proto::LrSchedule::Kind_IsValid, &kind));
  s->set_kind(kind);
  RETURN_IF_ERROR(Int<int64_t>("optimizer.lr_schedule.warmup_iters", s->warmup_iters(), 0, 0, kMaxIterations,
                               [&](int64_t v) { s->set_warmup_iters(v); }));
  RETURN_IF_ERROR(Int<int64_t>("optimizer.lr_schedule.decay_iters", s->decay_iters(), iterations, 1, kMaxIterations,
                               [&](int64_t v) { s->set_decay_iters(v); }));
  if (kind == proto::LrSchedule::cosine && s->decay_iters() < s->warmup_iters()) {
    return Bad("optimizer.lr_schedule.decay_iters",
               absl::StrCat(s->decay_iters(), " is shorter than warmup_iters ", s->warmup_iters()));
  }
  return Real("optimizer.lr_schedule.min_lr", s->min_lr(), 0, 0, o->lr(), [&](double v) { s->set_min_lr(v); });
}

absl::Status NormalizeCluster(bool analytic, proto::ClusterSpec* c) {
  RETURN_IF_ERROR(Name("cluster.name", c->name()));
  RETURN_IF_ERROR(Int("cluster.num_nodes", c->num_nodes(), kDefaultNumNodes, 1, kMaxNodes,
                      [&](int v) { c->set_num_nodes(v); }));
  RETURN_IF_ERROR(Int("cluster.devices_per_node", c->devices_per_node(), kDefaultDevicesPerNode, 1, kMaxDevicesPerNode,
                      [&](int v) { c->set_devices_per_node(v); }));
  proto::DeviceSpec* d = c->mutable_device();
  RETURN_IF_ERROR(Name("cluster.device.name", d->name()));
  // The analytic cost model needs the device's speeds; a measured profile does not.
  const double speed_lo = analytic ? 1e-9 : 0;
  const char* why = " (or set cost_profile_path)";
  if (analytic && d->peak_tflops() == 0) return Bad("cluster.device.peak_tflops", absl::StrCat("must be set", why));
  if (analytic && d->memory_bandwidth_gbps() == 0) {
    return Bad("cluster.device.memory_bandwidth_gbps", absl::StrCat("must be set", why));
  }
  RETURN_IF_ERROR(Real("cluster.device.peak_tflops", d->peak_tflops(), 0, speed_lo, kMaxTflops,
                       [&](double v) { d->set_peak_tflops(v); }));
  RETURN_IF_ERROR(Real("cluster.device.memory_bandwidth_gbps", d->memory_bandwidth_gbps(), 0, speed_lo, kMaxBandwidth,
                       [&](double v) { d->set_memory_bandwidth_gbps(v); }));
  RETURN_IF_ERROR(Real("cluster.device.memory_mb", d->memory_mb(), 0, 0, kMaxMemoryMb,
                       [&](double v) { d->set_memory_mb(v); }));
  RETURN_IF_ERROR(Real("cluster.intra_node_bandwidth_gbps", c->intra_node_bandwidth_gbps(),
                       kDefaultIntraNodeBandwidthGbps, 1e-6, kMaxBandwidth,
                       [&](double v) { c->set_intra_node_bandwidth_gbps(v); }));
  RETURN_IF_ERROR(Real("cluster.inter_node_bandwidth_gbps", c->inter_node_bandwidth_gbps(),
                       kDefaultInterNodeBandwidthGbps, 1e-6, kMaxBandwidth,
                       [&](double v) { c->set_inter_node_bandwidth_gbps(v); }));
  // Latencies may be 0.
  RETURN_IF_ERROR(Real("cluster.intra_node_latency_us", c->intra_node_latency_us(), 0, 0, kMaxLatencyUs,
                       [&](double v) { c->set_intra_node_latency_us(v); }));
  return Real("cluster.inter_node_latency_us", c->inter_node_latency_us(), 0, 0, kMaxLatencyUs,
              [&](double v) { c->set_inter_node_latency_us(v); });
}

}  // namespace

absl::Status CheckJobPath(absl::string_view field, absl::string_view path) {
  if (path.empty()) return Bad(field, "must be set");
  if (path.size() > kMaxPathBytes) {
    return Bad(field, absl::StrCat("longer than ", kMaxPathBytes, " bytes (", path.size(), ")"));
  }
  RETURN_IF_ERROR(Text(field, path));
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return Bad(field, "must not contain \"..\" (paths stay under the daemons' --data-root)");
  }
  return absl::OkStatus();
}

// Whether the normalised model has a Hugging Face class we read and write
// (runtime/model/hf_checkpoint.h): GPT-2's block for kind gpt, T5's for t5,
// Llama's for llama.
absl::Status HuggingFaceBlock(absl::string_view field, const proto::ModelSpec& m) {
  const proto::BlockSpec& b = m.block();
  if (m.kind() == proto::ModelKind::t5) {
    if (b.norm() == proto::NormKind::rmsnorm && !b.bias() && b.mlp() != proto::MlpKind::gelu) return absl::OkStatus();
    return Bad(field, "T5ForConditionalGeneration needs T5's block (rmsnorm, relu or gated_gelu, no biases)");
  }
  if (m.kind() == proto::ModelKind::llama) {
    if (b.norm() == proto::NormKind::rmsnorm && !b.bias() && b.mlp() == proto::MlpKind::swiglu &&
        b.positions() == proto::PositionKind::rotary) {
      return absl::OkStatus();
    }
    return Bad(field, "LlamaForCausalLM needs Llama's block (rmsnorm, swiglu, no biases, rotary positions)");
  }
  if (b.norm() == proto::NormKind::layernorm && b.bias() && b.mlp() == proto::MlpKind::gelu &&
      b.positions() == proto::PositionKind::learned && m.kv_heads() == m.heads()) {
    return absl::OkStatus();
  }
  return Bad(field, "GPT2LMHeadModel needs GPT-2's block (layernorm, gelu, biases, learned positions, kv_heads = heads)");
}

absl::StatusOr<proto::JobSpec> NormalizeJobSpec(proto::JobSpec spec) {
  RETURN_IF_ERROR(Name("name", spec.name()));
  RETURN_IF_ERROR(Int<int64_t>("iterations", spec.iterations(), 0, 1, kMaxIterations,
                               [&](int64_t v) { spec.set_iterations(v); }));
  RETURN_IF_ERROR(NormalizeModel(spec.mutable_model()));
  RETURN_IF_ERROR(NormalizeParallelism(spec.model(), spec.mutable_parallelism()));
  RETURN_IF_ERROR(NormalizeBatching(spec.mutable_model(), spec.mutable_batching()));
  RETURN_IF_ERROR(NormalizeSchedule(spec.mutable_schedule()));
  RETURN_IF_ERROR(NormalizeOptimizer(spec.iterations(), spec.mutable_optimizer()));

  proto::DatasetSpec* ds = spec.mutable_dataset();
  RETURN_IF_ERROR(CheckJobPath("dataset.path", ds->path()));
  proto::DatasetSpec::Format format{};
  RETURN_IF_ERROR(Enum("dataset.format", ds->format(), proto::DatasetSpec::lengths, proto::DatasetSpec::Format_IsValid,
                       &format));
  ds->set_format(format);
  if (!spec.cost_profile_path().empty()) RETURN_IF_ERROR(CheckJobPath("cost_profile_path", spec.cost_profile_path()));
  if (!spec.model().init_from().empty()) {
    RETURN_IF_ERROR(CheckJobPath("model.init_from", spec.model().init_from()));
    RETURN_IF_ERROR(HuggingFaceBlock("model.init_from", spec.model()));
  }
  if (!spec.export_dir().empty()) {
    RETURN_IF_ERROR(CheckJobPath("export_dir", spec.export_dir()));
    RETURN_IF_ERROR(HuggingFaceBlock("export_dir", spec.model()));
  }

  proto::CheckpointSpec* ck = spec.mutable_checkpoint();
  RETURN_IF_ERROR(Int<int64_t>("checkpoint.interval", ck->interval(), 0, 0, kMaxIterations,
                               [&](int64_t v) { ck->set_interval(v); }));
  if (ck->dir().empty()) {
    if (ck->interval() > 0 || ck->resume()) {
      return Bad("checkpoint.dir", "must be set to write or resume checkpoints");
    }
  } else {
    RETURN_IF_ERROR(CheckJobPath("checkpoint.dir", ck->dir()));
    // "/ckpt/run/" and "/ckpt/run" are one directory.
    std::string dir = ck->dir();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    ck->set_dir(dir);
  }

  RETURN_IF_ERROR(Int("planner_lookahead", spec.planner_lookahead(), kDefaultPlannerLookahead, 1, kMaxLookahead,
                      [&](int v) { spec.set_planner_lookahead(v); }));
  RETURN_IF_ERROR(NormalizeCostRefit(spec.mutable_cost_refit()));
  RETURN_IF_ERROR(NormalizeCluster(spec.cost_profile_path().empty(), spec.mutable_cluster()));
  RETURN_IF_ERROR(Real("memory_limit_mb", spec.memory_limit_mb(), spec.cluster().device().memory_mb(), 0, kMaxMemoryMb,
                       [&](double v) { spec.set_memory_limit_mb(v); }));
  if (spec.memory_limit_mb() == 0) return Bad("memory_limit_mb", "must be set (or cluster.device.memory_mb)");
  // A job needing more devices than its cluster declares would wait forever.
  const int64_t ranks = int64_t{spec.parallelism().pp()} * spec.parallelism().dp();
  const int64_t devices = int64_t{spec.cluster().num_nodes()} * spec.cluster().devices_per_node();
  if (ranks > devices) {
    return Bad("parallelism.pp", absl::StrCat(spec.parallelism().pp(), " x parallelism.dp ", spec.parallelism().dp(), " = ",
                                           ranks, " ranks exceed the ", devices,
                                           " devices of the cluster (cluster.num_nodes x cluster.devices_per_node)"));
  }
  return spec;
}

absl::StatusOr<NormalizedJobSpec> NormalizedJobSpec::Normalize(proto::JobSpec spec) {
  ASSIGN_OR_RETURN(proto::JobSpec normalized, NormalizeJobSpec(std::move(spec)));
  return NormalizedJobSpec(std::move(normalized));
}

absl::StatusOr<NormalizedJobSpec> LoadJobSpec(const std::string& path) {
  proto::JobSpec spec;
  RETURN_IF_ERROR(LoadProtoFile(path, &spec));
  return Annotate(NormalizedJobSpec::Normalize(std::move(spec)), path);
}

absl::StatusOr<JobPaths> ConfineJobPaths(const NormalizedJobSpec& spec, const std::string& data_root) {
  JobPaths out;
  if (!spec->checkpoint().dir().empty()) {
    ASSIGN_OR_RETURN(out.checkpoint_dir,
                     Annotate(ConfinedPath(data_root, spec->checkpoint().dir()), "checkpoint.dir"));
  }
  if (!spec->cost_profile_path().empty()) {
    ASSIGN_OR_RETURN(out.cost_profile,
                     Annotate(ConfinedPath(data_root, spec->cost_profile_path()), "cost_profile_path"));
  }
  if (!spec->export_dir().empty()) {
    ASSIGN_OR_RETURN(out.export_dir, Annotate(ConfinedPath(data_root, spec->export_dir()), "export_dir"));
  }
  if (!spec->model().init_from().empty()) {
    ASSIGN_OR_RETURN(out.init_from,
                     Annotate(ConfinedPath(data_root, spec->model().init_from()), "model.init_from"));
  }
  ASSIGN_OR_RETURN(out.dataset, Annotate(ConfinedPath(data_root, spec->dataset().path()), "dataset.path"));
  return out;
}

}  // namespace dynapipe::spec
