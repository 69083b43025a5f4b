#include "src/spec/job_spec.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>

#include "google/protobuf/util/message_differencer.h"
#include "src/common/proto_io.h"

namespace dynapipe::spec {
namespace {

// The smallest job a user could submit: everything else defaults.
proto::JobSpec Minimal() {
  proto::JobSpec s;
  REQUIRE(ParseTextProto(R"pb(
            name: "minimal"
            model { kind: gpt num_layers: 2 hidden: 64 heads: 4 vocab: 100 }
            dataset { path: "data/lengths.txt" }
            iterations: 10
            cluster { device { peak_tflops: 1 memory_bandwidth_gbps: 10 memory_mb: 1000 } }
          )pb",
                         "spec", &s)
              .ok());
  return s;
}

TEST_CASE("NormalizeJobSpec writes out every default, once") {
  auto n = NormalizeJobSpec(Minimal());
  REQUIRE(n.ok());
  CHECK(n->parallelism().pp() == kDefaultPp);
  CHECK(n->parallelism().dp() == kDefaultDp);
  CHECK(n->model().ffn() == 4 * 64);
  CHECK(n->model().max_positions() == kDefaultMaxSeqLen);
  CHECK(n->model().attention() == proto::AttentionKernel::varlen);
  CHECK(n->model().block().norm() == kDefaultGptNorm);
  CHECK(n->model().block().mlp() == kDefaultGptMlp);
  CHECK(n->model().block().has_bias());
  CHECK(n->model().block().bias() == kDefaultGptBias);
  proto::JobSpec t5 = Minimal();
  t5.mutable_model()->set_kind(proto::ModelKind::t5);
  t5.mutable_model()->set_num_decoder_layers(2);
  t5.mutable_model()->mutable_block()->set_mlp(proto::MlpKind::gated_gelu);  // FLAN-T5's
  auto nt = NormalizeJobSpec(t5);
  REQUIRE(nt.ok());
  CHECK(nt->model().block().norm() == kDefaultT5Norm);
  CHECK(nt->model().block().mlp() == proto::MlpKind::gated_gelu);
  CHECK(nt->model().block().bias() == kDefaultT5Bias);
  CHECK(n->dataset().format() == proto::DatasetSpec::lengths);
  CHECK(n->batching().method() == proto::BatchingSpec::dynamic);
  CHECK(n->batching().global_batch_tokens() == kDefaultGlobalBatchTokens);
  CHECK(n->batching().max_seq_len() == kDefaultMaxSeqLen);
  CHECK(n->batching().round_multiple() == kDefaultRoundMultiple);
  CHECK(n->batching().cap_tolerance() == kDefaultCapTolerance);
  CHECK(n->batching().dp_candidates() == kDefaultDpCandidates);
  CHECK(n->schedule().policy() == proto::ScheduleSpec::auto_);
  CHECK(n->schedule().recompute() == proto::RecomputeLevel::auto_);
  CHECK(n->schedule().permutations() == kDefaultPermutations);
  CHECK(n->optimizer().lr() == kDefaultLr);
  CHECK(n->optimizer().beta1() == kDefaultBeta1);
  CHECK(n->optimizer().beta2() == kDefaultBeta2);
  CHECK(n->optimizer().eps() == kDefaultEps);
  CHECK(n->optimizer().weight_decay() == kDefaultWeightDecay);
  CHECK(n->optimizer().lr_schedule().kind() == proto::LrSchedule::constant);
  CHECK(n->optimizer().lr_schedule().decay_iters() == 10);
  CHECK(n->planner_lookahead() == kDefaultPlannerLookahead);
  CHECK(n->memory_limit_mb() == 1000);
  CHECK(n->cluster().num_nodes() == kDefaultNumNodes);
  CHECK(n->cluster().devices_per_node() == kDefaultDevicesPerNode);
  CHECK(n->cluster().intra_node_bandwidth_gbps() == kDefaultIntraNodeBandwidthGbps);
  CHECK(n->cluster().inter_node_bandwidth_gbps() == kDefaultInterNodeBandwidthGbps);
}

TEST_CASE("A llama model takes Llama's block; rotary, kv_heads, norm_eps and rope_base are checked") {
  proto::JobSpec s = Minimal();
  s.mutable_model()->set_kind(proto::ModelKind::llama);
  auto n = NormalizeJobSpec(s);
  REQUIRE(n.ok());
  const proto::BlockSpec& b = n->model().block();
  CHECK(b.norm() == kDefaultLlamaNorm);
  CHECK(b.mlp() == kDefaultLlamaMlp);
  CHECK(b.bias() == kDefaultLlamaBias);
  CHECK(b.positions() == proto::PositionKind::rotary);
  CHECK(b.norm_eps() == kDefaultLlamaNormEps);
  CHECK(b.rope_base() == kDefaultRopeBase);
  CHECK(n->model().kv_heads() == 4);
  auto g = NormalizeJobSpec(Minimal());
  REQUIRE(g.ok());
  CHECK(g->model().block().positions() == proto::PositionKind::learned);
  CHECK(g->model().block().norm_eps() == kDefaultLayerNormEps);
  CHECK(!g->model().block().has_rope_base());
  auto refused = [&](const std::function<void(proto::JobSpec*)>& edit, const std::string& line) {
    proto::JobSpec bad = s;
    edit(&bad);
    const absl::Status st = NormalizeJobSpec(bad).status();
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(st.message() == line);
  };
  refused([](auto* j) { j->mutable_model()->set_kv_heads(3); }, "model.kv_heads: 3 does not divide model.heads 4");
  refused([](auto* j) { j->mutable_model()->set_kv_heads(8); }, "model.kv_heads: must be in 1..4, got 8");
  refused([](auto* j) { j->mutable_model()->set_heads(64); },
          "model.block.positions: rotary positions need an even head size, got 1");
  refused([](auto* j) { j->mutable_model()->mutable_block()->set_norm_eps(2); },
          "model.block.norm_eps: must be in [1e-12, 1], got 2");
  refused(
      [](auto* j) {
        j->mutable_model()->mutable_block()->set_positions(proto::PositionKind::learned);
        j->mutable_model()->mutable_block()->set_rope_base(500);
      },
      "model.block.rope_base: only rotary positions have a base");
  refused(
      [](auto* j) {
        j->mutable_model()->set_kind(proto::ModelKind::t5);
        j->mutable_model()->set_num_decoder_layers(1);
        j->mutable_model()->set_kv_heads(2);
      },
      "model.kv_heads: T5 stages have one key and value head per head");
  // Hugging Face's LlamaForCausalLM holds only Llama's block.
  proto::JobSpec gelu = s;
  gelu.set_export_dir("out/hf");
  CHECK(NormalizeJobSpec(gelu).ok());
  gelu.mutable_model()->mutable_block()->set_mlp(proto::MlpKind::gelu);
  CHECK(NormalizeJobSpec(gelu).status().message().find("export_dir: LlamaForCausalLM needs Llama's block") !=
        absl::string_view::npos);
}

TEST_CASE("NormalizeJobSpec is idempotent and keeps what the user set") {
  proto::JobSpec s = Minimal();
  s.mutable_model()->set_max_positions(512);
  s.mutable_optimizer()->set_lr(5e-3);
  s.mutable_checkpoint()->set_dir("out/ckpt///");
  s.mutable_checkpoint()->set_interval(5);
  auto once = NormalizeJobSpec(s);
  REQUIRE(once.ok());
  CHECK(once->batching().max_seq_len() == 512);  // the smaller of 2048 and max_positions
  CHECK(once->optimizer().lr() == 5e-3);
  CHECK(once->checkpoint().dir() == "out/ckpt");
  auto twice = NormalizeJobSpec(*once);
  REQUIRE(twice.ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(*once, *twice));
}

TEST_CASE("Every shipped job normalises") {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(srcdir) + "/dynapipe/configs/jobs")) {
    INFO(e.path().string());
    proto::JobSpec s;
    REQUIRE(LoadProtoFile(e.path().string(), &s).ok());
    auto n = NormalizeJobSpec(s);
    INFO(n.status().message());
    CHECK(n.ok());
    ++checked;
  }
  CHECK(checked >= 3);
}

struct BadCase {
  const char* what;
  std::function<void(proto::JobSpec*)> edit;
  const char* field;  // the error starts with "<field>: "
};

TEST_CASE("NormalizeJobSpec refuses garbage with one line naming the field") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<BadCase> cases = {
      {"lr -1", [](auto* s) { s->mutable_optimizer()->set_lr(-1); }, "optimizer.lr"},
      {"lr NaN", [&](auto* s) { s->mutable_optimizer()->set_lr(nan); }, "optimizer.lr"},
      {"lr inf", [&](auto* s) { s->mutable_optimizer()->set_lr(inf); }, "optimizer.lr"},
      {"beta1 1.5", [](auto* s) { s->mutable_optimizer()->set_beta1(1.5); }, "optimizer.beta1"},
      {"beta2 1", [](auto* s) { s->mutable_optimizer()->set_beta2(1); }, "optimizer.beta2"},
      {"eps -1", [](auto* s) { s->mutable_optimizer()->set_eps(-1); }, "optimizer.eps"},
      {"weight decay NaN", [&](auto* s) { s->mutable_optimizer()->set_weight_decay(nan); }, "optimizer.weight_decay"},
      {"grad clip -1", [](auto* s) { s->mutable_optimizer()->set_grad_clip(-1); }, "optimizer.grad_clip"},
      {"min_lr above lr",
       [](auto* s) {
         s->mutable_optimizer()->set_lr(1e-3);
         s->mutable_optimizer()->mutable_lr_schedule()->set_min_lr(1e-2);
       },
       "optimizer.lr_schedule.min_lr"},
      {"lr schedule kind 99",
       [](auto* s) { s->mutable_optimizer()->mutable_lr_schedule()->set_kind(static_cast<proto::LrSchedule::Kind>(99)); },
       "optimizer.lr_schedule.kind"},
      {"block norm 7",
       [](auto* s) { s->mutable_model()->mutable_block()->set_norm(static_cast<proto::NormKind::Value>(7)); },
       "model.block.norm"},
      {"block mlp 9",
       [](auto* s) { s->mutable_model()->mutable_block()->set_mlp(static_cast<proto::MlpKind::Value>(9)); },
       "model.block.mlp"},
      {"batching method 99",
       [](auto* s) { s->mutable_batching()->set_method(static_cast<proto::BatchingSpec::Method>(99)); },
       "batching.method"},
      {"schedule policy 99",
       [](auto* s) { s->mutable_schedule()->set_policy(static_cast<proto::ScheduleSpec::Policy>(99)); },
       "schedule.policy"},
      {"recompute -3",
       [](auto* s) { s->mutable_schedule()->set_recompute(static_cast<proto::RecomputeLevel::Value>(-3)); },
       "schedule.recompute"},
      {"dtype 99", [](auto* s) { s->mutable_model()->set_dtype(static_cast<proto::DType::Value>(99)); },
       "model.dtype"},
      {"dtype int32", [](auto* s) { s->mutable_model()->set_dtype(proto::DType::int32); }, "model.dtype"},
      {"kind 99", [](auto* s) { s->mutable_model()->set_kind(static_cast<proto::ModelKind::Value>(99)); },
       "model.kind"},
      {"no kind", [](auto* s) { s->mutable_model()->clear_kind(); }, "model.kind"},
      {"dataset format 7",
       [](auto* s) { s->mutable_dataset()->set_format(static_cast<proto::DatasetSpec::Format>(7)); },
       "dataset.format"},
      {"2^31-1 layers", [](auto* s) { s->mutable_model()->set_num_layers(2147483647); }, "model.num_layers"},
      {"negative ffn", [](auto* s) { s->mutable_model()->set_ffn(-4); }, "model.ffn"},
      {"negative max_positions", [](auto* s) { s->mutable_model()->set_max_positions(-1); }, "model.max_positions"},
      {"heads not dividing hidden", [](auto* s) { s->mutable_model()->set_heads(6); }, "model.heads"},
      {"huge vocab", [](auto* s) { s->mutable_model()->set_vocab(1 << 30); }, "model.vocab"},
      {"decoder layers on gpt", [](auto* s) { s->mutable_model()->set_num_decoder_layers(2); },
       "model.num_decoder_layers"},
      {"t5 without decoder",
       [](auto* s) { s->mutable_model()->set_kind(proto::ModelKind::t5); }, "model.num_decoder_layers"},
      {"negative num_nodes", [](auto* s) { s->mutable_cluster()->set_num_nodes(-2); }, "cluster.num_nodes"},
      {"negative bandwidth", [](auto* s) { s->mutable_cluster()->set_intra_node_bandwidth_gbps(-1); },
       "cluster.intra_node_bandwidth_gbps"},
      {"NaN latency", [&](auto* s) { s->mutable_cluster()->set_inter_node_latency_us(nan); },
       "cluster.inter_node_latency_us"},
      {"no device speed", [](auto* s) { s->mutable_cluster()->mutable_device()->clear_peak_tflops(); },
       "cluster.device.peak_tflops"},
      {"no memory", [](auto* s) { s->mutable_cluster()->mutable_device()->clear_memory_mb(); }, "memory_limit_mb"},
      {"negative memory limit", [](auto* s) { s->set_memory_limit_mb(-5); }, "memory_limit_mb"},
      {"pp 0 x dp huge", [](auto* s) { s->mutable_parallelism()->set_dp(1 << 20); }, "parallelism.dp"},
      {"pp beyond limit", [](auto* s) { s->mutable_parallelism()->set_pp(kMaxPp + 1); }, "parallelism.pp"},
      {"layer on a missing device",
       [](auto* s) {
         s->mutable_parallelism()->add_layer_to_device(0);
         s->mutable_parallelism()->add_layer_to_device(3);
       },
       "parallelism.layer_to_device[1]"},
      {"max_seq_len above max_positions",
       [](auto* s) {
         s->mutable_model()->set_max_positions(128);
         s->mutable_batching()->set_max_seq_len(256);
       },
       "batching.max_seq_len"},
      {"negative global batch", [](auto* s) { s->mutable_batching()->set_global_batch_tokens(-1); },
       "batching.global_batch_tokens"},
      {"cap tolerance 2", [](auto* s) { s->mutable_batching()->set_cap_tolerance(2); }, "batching.cap_tolerance"},
      {"permutations 1000", [](auto* s) { s->mutable_schedule()->set_permutations(1000); }, "schedule.permutations"},
      {"no iterations", [](auto* s) { s->clear_iterations(); }, "iterations"},
      {"lookahead -1", [](auto* s) { s->set_planner_lookahead(-1); }, "planner_lookahead"},
      {"a 300 KB name", [](auto* s) { s->set_name(std::string(300 << 10, 'x')); }, "name"},
      {"a name with a newline", [](auto* s) { s->set_name("a\nb"); }, "name"},
      {"a model name of 1 KB", [](auto* s) { s->mutable_model()->set_name(std::string(1024, 'm')); }, "model.name"},
      {"no dataset", [](auto* s) { s->mutable_dataset()->clear_path(); }, "dataset.path"},
      {"dataset escaping with ..", [](auto* s) { s->mutable_dataset()->set_path("data/../../etc/shadow"); },
       "dataset.path"},
      {"dataset path with NUL", [](auto* s) { s->mutable_dataset()->set_path(std::string("a\0b", 3)); },
       "dataset.path"},
      {"a 5000-byte path", [](auto* s) { s->mutable_dataset()->set_path(std::string(5000, 'p')); }, "dataset.path"},
      {"checkpoint dir with ..", [](auto* s) { s->mutable_checkpoint()->set_dir("../elsewhere"); }, "checkpoint.dir"},
      {"interval without dir", [](auto* s) { s->mutable_checkpoint()->set_interval(5); }, "checkpoint.dir"},
      {"resume without dir", [](auto* s) { s->mutable_checkpoint()->set_resume(true); }, "checkpoint.dir"},
      {"negative interval",
       [](auto* s) {
         s->mutable_checkpoint()->set_dir("ck");
         s->mutable_checkpoint()->set_interval(-1);
       },
       "checkpoint.interval"},
      {"profile path with ..", [](auto* s) { s->set_cost_profile_path("../p.json"); }, "cost_profile_path"},
      {"name: a lone continuation byte", [](auto* s) { s->set_name("job\x80"); }, "name"},
      {"name: an overlong '/'", [](auto* s) { s->set_name("\xc0\xaf"); }, "name"},
      {"device name: a surrogate", [](auto* s) { s->mutable_cluster()->mutable_device()->set_name("\xed\xa0\x80"); },
       "cluster.device.name"},
      {"dataset path: a truncated sequence", [](auto* s) { s->mutable_dataset()->set_path("data/\xe2\x82"); },
       "dataset.path"},
  };
  for (const BadCase& c : cases) {
    INFO(c.what);
    proto::JobSpec s = Minimal();
    c.edit(&s);
    auto n = NormalizeJobSpec(s);
    REQUIRE_FALSE(n.ok());
    INFO(n.status().message());
    CHECK(n.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(n.status().message()).rfind(std::string(c.field) + ": ", 0) == 0);
    CHECK(std::string(n.status().message()).find('\n') == std::string::npos);
    CHECK(n.status().message().size() < 200);
  }
}

TEST_CASE("Names and paths in any script pass the UTF-8 check") {
  proto::JobSpec s = Minimal();
  s.set_name("flan-\xc3\xa9t\xc3\xa9-\xe6\xb7\xb7\xe5\x90\x88-\xf0\x9f\x9a\x80");  // é, 混合, an emoji
  s.mutable_dataset()->set_path("donn\xc3\xa9" "es/flan");
  CHECK(NormalizeJobSpec(s).ok());
}

TEST_CASE("CheckJobPath accepts plain relative and absolute paths") {
  CHECK(CheckJobPath("p", "data/flan").ok());
  CHECK(CheckJobPath("p", "/srv/data/flan").ok());
  CHECK(CheckJobPath("p", "a..b/c").ok());  // ".." only as a whole component
  CHECK_FALSE(CheckJobPath("p", "a/..").ok());
  CHECK_FALSE(CheckJobPath("p", "").ok());
}

}  // namespace
}  // namespace dynapipe::spec

namespace dynapipe::spec {
namespace {

TEST_CASE("model.init_from and export_dir need a block Hugging Face's classes hold, and a path under the root") {
  proto::JobSpec s = Minimal();
  s.set_export_dir("out/hf");
  s.mutable_model()->set_init_from("models/gpt2");
  CHECK(NormalizeJobSpec(s).ok());  // GPT-2's block
  proto::JobSpec relu = s;
  relu.mutable_model()->mutable_block()->set_mlp(proto::MlpKind::relu);
  const absl::Status r = NormalizeJobSpec(relu).status();
  CHECK(r.code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.message().find("model.init_from: GPT2LMHeadModel needs GPT-2's block") != absl::string_view::npos);
  relu.mutable_model()->clear_init_from();
  CHECK(NormalizeJobSpec(relu).status().message().find("export_dir: GPT2LMHeadModel") != absl::string_view::npos);
  proto::JobSpec t5 = s;
  t5.mutable_model()->set_kind(proto::ModelKind::t5);
  t5.mutable_model()->set_num_decoder_layers(2);
  CHECK(NormalizeJobSpec(t5).ok());  // T5's block by default
  t5.mutable_model()->mutable_block()->set_bias(true);
  CHECK(NormalizeJobSpec(t5).status().message().find("T5ForConditionalGeneration needs T5's block") !=
        absl::string_view::npos);
  proto::JobSpec up = s;
  up.set_export_dir("../outside");
  CHECK(NormalizeJobSpec(up).status().message().find("export_dir") != absl::string_view::npos);
}

}  // namespace
}  // namespace dynapipe::spec
