#include "tests/hostile/job_corpus.h"

#include <cstdint>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "planner/testing/test_specs.h"

namespace dynapipe::testing::hostile {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A copy of `base` changed by `edit`.
SpecCase Case(const proto::JobSpec& base, std::string name, const std::function<void(proto::JobSpec*)>& edit) {
  SpecCase c{std::move(name), base};
  edit(&c.spec);
  return c;
}

// Walks the singular scalar fields of `m`'s type; `path` names `m`.
void Walk(const google::protobuf::Descriptor* d, const std::string& path,
          std::vector<std::pair<std::string, std::vector<const FieldDescriptor*>>>* fields,
          std::vector<const FieldDescriptor*> chain) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;  // layer_to_device: FieldMutations
    const std::string name = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    std::vector<const FieldDescriptor*> c = chain;
    c.push_back(f);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Walk(f->message_type(), name, fields, c);
    } else {
      fields->push_back({name, c});
    }
  }
}

// The message holding the last field of `chain` inside `spec`.
Message* Holder(proto::JobSpec* spec, const std::vector<const FieldDescriptor*>& chain) {
  Message* m = spec;
  for (size_t i = 0; i + 1 < chain.size(); ++i) m = m->GetReflection()->MutableMessage(m, chain[i]);
  return m;
}

}  // namespace

proto::JobSpec BaseJob(const std::string& lengths) {
  proto::JobSpec s;
  s.set_name("hostile-base");
  auto* m = s.mutable_model();
  m->set_kind(proto::ModelKind::gpt);
  m->set_num_layers(8);
  m->set_hidden(256);
  m->set_heads(8);
  m->set_ffn(1024);
  m->set_vocab(32000);
  m->set_max_positions(2048);
  m->set_dtype(proto::DType::bf16);
  s.mutable_parallelism()->set_pp(2);
  s.mutable_parallelism()->set_dp(1);
  s.mutable_dataset()->set_path(lengths);
  s.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
  s.mutable_batching()->set_global_batch_tokens(16384);
  s.mutable_batching()->set_max_seq_len(1024);
  s.mutable_optimizer()->set_lr(3e-4);
  s.set_memory_limit_mb(40000);
  s.set_iterations(4);
  s.set_planner_lookahead(2);
  *s.mutable_cluster() = planner::testing::H100Cluster();
  return s;
}

std::vector<SpecCase> NumericMutations(const proto::JobSpec& base) {
  std::vector<std::pair<std::string, std::vector<const FieldDescriptor*>>> fields;
  Walk(proto::JobSpec::descriptor(), "", &fields, {});
  std::vector<SpecCase> out;
  for (const auto& [name, chain] : fields) {
    const FieldDescriptor* f = chain.back();
    auto add = [&](const std::string& shown, const std::function<void(Message*)>& set) {
      out.push_back(Case(base, absl::StrCat(name, " = ", shown), [&](proto::JobSpec* s) { set(Holder(s, chain)); }));
    };
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        for (const int32_t v : {-1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
          add(absl::StrCat(v), [&](Message* m) { m->GetReflection()->SetInt32(m, f, v); });
        }
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        for (const int64_t v : {int64_t{-1}, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                                int64_t{1} << 40}) {
          add(absl::StrCat(v), [&](Message* m) { m->GetReflection()->SetInt64(m, f, v); });
        }
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        for (const double v : {-1.0, kNan, kInf, -kInf, 1e308}) {
          add(absl::StrCat(v), [&](Message* m) { m->GetReflection()->SetDouble(m, f, v); });
        }
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        for (const int v : {99, -3}) {
          add(absl::StrCat(v), [&](Message* m) { m->GetReflection()->SetEnumValue(m, f, v); });
        }
        break;
      default:  // uint64 seed: every value is legal; bools; strings (StringMutations)
        break;
    }
  }
  return out;
}

std::vector<SpecCase> FieldMutations(const proto::JobSpec& base) {
  std::vector<SpecCase> v;
  auto add = [&](std::string name, const std::function<void(proto::JobSpec*)>& edit) {
    v.push_back(Case(base, std::move(name), edit));
  };
  add("model.kind = unspecified", [](auto* s) { s->mutable_model()->set_kind(proto::ModelKind::unspecified); });
  add("model.dtype = int32", [](auto* s) { s->mutable_model()->set_dtype(proto::DType::int32); });
  add("model.num_layers = 0 (required)", [](auto* s) { s->mutable_model()->set_num_layers(0); });
  add("model.hidden = 0 (required)", [](auto* s) { s->mutable_model()->set_hidden(0); });
  add("model.heads = 0 (required)", [](auto* s) { s->mutable_model()->set_heads(0); });
  add("model.vocab = 0 (required)", [](auto* s) { s->mutable_model()->set_vocab(0); });
  add("model.heads = 24 (does not divide hidden 256)", [](auto* s) { s->mutable_model()->set_heads(24); });
  add("model.num_decoder_layers = 2 on a gpt", [](auto* s) { s->mutable_model()->set_num_decoder_layers(2); });
  add("model.max_positions = 512 < batching.max_seq_len 1024",
      [](auto* s) { s->mutable_model()->set_max_positions(512); });
  add("batching.round_multiple = 4097", [](auto* s) { s->mutable_batching()->set_round_multiple(4097); });
  add("batching.cap_tolerance = 1.5", [](auto* s) { s->mutable_batching()->set_cap_tolerance(1.5); });
  add("batching.dp_candidates = 65", [](auto* s) { s->mutable_batching()->set_dp_candidates(65); });
  add("schedule.permutations = 65", [](auto* s) { s->mutable_schedule()->set_permutations(65); });
  add("optimizer.beta1 = 1", [](auto* s) { s->mutable_optimizer()->set_beta1(1); });
  add("optimizer.beta2 = 1", [](auto* s) { s->mutable_optimizer()->set_beta2(1); });
  add("optimizer.eps = 2", [](auto* s) { s->mutable_optimizer()->set_eps(2); });
  add("optimizer.lr = 1e-13", [](auto* s) { s->mutable_optimizer()->set_lr(1e-13); });
  add("optimizer.lr = 11", [](auto* s) { s->mutable_optimizer()->set_lr(11); });
  add("optimizer.weight_decay = 11", [](auto* s) { s->mutable_optimizer()->set_weight_decay(11); });
  add("optimizer.grad_clip = 1e13", [](auto* s) { s->mutable_optimizer()->set_grad_clip(1e13); });
  add("optimizer.lr_schedule.min_lr = 2 x lr",
      [](auto* s) { s->mutable_optimizer()->mutable_lr_schedule()->set_min_lr(6e-4); });
  add("cosine schedule: warmup_iters 100 > decay_iters 10", [](auto* s) {
    auto* l = s->mutable_optimizer()->mutable_lr_schedule();
    l->set_kind(proto::LrSchedule::cosine);
    l->set_warmup_iters(100);
    l->set_decay_iters(10);
  });
  add("parallelism.layer_to_device: 3 entries for 8 layers", [](auto* s) {
    for (int d : {0, 1, 1}) s->mutable_parallelism()->add_layer_to_device(d);
  });
  add("parallelism.layer_to_device[0] = -1", [](auto* s) {
    for (int d : {-1, 0, 0, 0, 1, 1, 1, 1}) s->mutable_parallelism()->add_layer_to_device(d);
  });
  add("parallelism.layer_to_device[7] = pp", [](auto* s) {
    for (int d : {0, 0, 0, 0, 1, 1, 1, 2}) s->mutable_parallelism()->add_layer_to_device(d);
  });
  add("parallelism.layer_to_device: 1,000,000 entries", [](auto* s) {
    for (int i = 0; i < 1000000; ++i) s->mutable_parallelism()->add_layer_to_device(i % 2);
  });
  add("parallelism: pp 1024 x dp 2048 (world over 2^20)", [](auto* s) {
    s->mutable_model()->set_num_layers(1024);
    s->mutable_parallelism()->set_pp(1024);
    s->mutable_parallelism()->set_dp(2048);
  });
  add("parallelism.pp = 16 > 8 layers", [](auto* s) { s->mutable_parallelism()->set_pp(16); });
  add("schedule.policy = 1f1b with an interleaved layer_to_device", [](auto* s) {
    s->mutable_schedule()->set_policy(proto::ScheduleSpec::one_f_one_b);
    for (int i = 0; i < 8; ++i) s->mutable_parallelism()->add_layer_to_device(i % 2);
  });
  add("schedule.policy = interleaved_1f1b with contiguous stages",
      [](auto* s) { s->mutable_schedule()->set_policy(proto::ScheduleSpec::interleaved_1f1b); });
  add("checkpoint.interval = 5 without checkpoint.dir", [](auto* s) { s->mutable_checkpoint()->set_interval(5); });
  add("checkpoint.resume without checkpoint.dir", [](auto* s) { s->mutable_checkpoint()->set_resume(true); });
  add("iterations = 0 (required)", [](auto* s) { s->set_iterations(0); });
  add("memory_limit_mb = 0 and cluster.device.memory_mb = 0", [](auto* s) {
    s->set_memory_limit_mb(0);
    s->mutable_cluster()->mutable_device()->set_memory_mb(0);
  });
  add("cluster.device.peak_tflops = 0 without a cost profile",
      [](auto* s) { s->mutable_cluster()->mutable_device()->set_peak_tflops(0); });
  add("cluster.device.memory_bandwidth_gbps = 0 without a cost profile",
      [](auto* s) { s->mutable_cluster()->mutable_device()->set_memory_bandwidth_gbps(0); });
  add("dp = 2 with batching.global_batch_tokens = 1 (batches smaller than dp)", [](auto* s) {
    s->mutable_parallelism()->set_dp(2);
    s->mutable_batching()->set_global_batch_tokens(1);
  });
  add("planner_lookahead = 1025", [](auto* s) { s->set_planner_lookahead(1025); });
  add("cluster.devices_per_node = 1025", [](auto* s) { s->mutable_cluster()->set_devices_per_node(1025); });
  add("cluster.num_nodes = 65537", [](auto* s) { s->mutable_cluster()->set_num_nodes(65537); });
  add("iterations = 1,000,000,001", [](auto* s) { s->set_iterations(1000000001); });
  add("batching.global_batch_tokens = 2^34 + 1", [](auto* s) {
    s->mutable_batching()->set_global_batch_tokens((int64_t{1} << 34) + 1);
  });
  // Accepted once, then could not run or tied up the cluster:
  add("batching.round_multiple = 3 (max_seq_len 1024 rounds to 1026 > max_positions 1024)", [](auto* s) {
    s->mutable_batching()->set_round_multiple(3);
    s->mutable_model()->set_max_positions(1024);
  });
  add("batching.global_batch_tokens = 2^34 (the allowed maximum; far over the dataset)", [](auto* s) {
    s->mutable_batching()->set_global_batch_tokens(int64_t{1} << 34);
  });
  add("global batches of ~18,600 samples (over the planning bound of 16,384)", [](auto* s) {
    s->mutable_dataset()->set_path("many-short.txt");  // DataRoot::many_short: 70,000 tokens
    s->mutable_batching()->set_global_batch_tokens(65000);
  });
  add("parallelism: pp 4 x dp 4 = 16 ranks on a cluster of 4 devices", [](auto* s) {
    s->mutable_parallelism()->set_pp(4);
    s->mutable_parallelism()->set_dp(4);
    s->mutable_cluster()->set_num_nodes(1);
    s->mutable_cluster()->set_devices_per_node(4);
  });
  // Llama-style decoders: grouped heads that do not divide the heads, and
  // blocks LlamaForCausalLM cannot hold where a job reads or writes it.
  add("model.kind = llama with kv_heads = 3 (does not divide heads 8)", [](auto* s) {
    s->mutable_model()->set_kind(proto::ModelKind::llama);
    s->mutable_model()->set_kv_heads(3);
  });
  add("model.kind = llama with block.rope_base = 0.5", [](auto* s) {
    s->mutable_model()->set_kind(proto::ModelKind::llama);
    s->mutable_model()->mutable_block()->set_rope_base(0.5);
  });
  add("model.kind = llama with block.mlp = gelu and model.init_from (not Llama's block)", [](auto* s) {
    s->mutable_model()->set_kind(proto::ModelKind::llama);
    s->mutable_model()->mutable_block()->set_mlp(proto::MlpKind::gelu);
    s->mutable_model()->set_init_from("weights/valid");
  });
  add("model.kind = llama with block.positions = learned and export_dir (not Llama's block)", [](auto* s) {
    s->mutable_model()->set_kind(proto::ModelKind::llama);
    s->mutable_model()->mutable_block()->set_positions(proto::PositionKind::learned);
    s->set_export_dir("out/llama-hf");
  });
  add("model.kind = gpt with kv_heads = 4 and export_dir (GPT2LMHeadModel has a key-value head per head)",
      [](auto* s) {
        s->mutable_model()->set_kv_heads(4);
        s->set_export_dir("out/gpt-hf");
      });
  return v;
}

std::vector<SpecCase> StringMutations(const proto::JobSpec& base) {
  std::vector<SpecCase> v;
  const std::string mb(1 << 20, 'n');
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"257 bytes", std::string(257, 'n')},
      {"1 MB", mb},
      {"\\x01", "job\x01"},
      {"a newline", "job\ninjected log line"},
      {"an ANSI escape", "\x1b[31mred"},
      {"DEL", "job\x7f"},
      {"an embedded NUL", std::string("job\0tail", 8)},
      {"invalid UTF-8", "job\xff\xfe"},
  };
  for (const auto& [what, value] : bad) {
    v.push_back(Case(base, "name: " + what, [&](auto* s) { s->set_name(value); }));
  }
  v.push_back(Case(base, "model.name: 1 MB", [&](auto* s) { s->mutable_model()->set_name(mb); }));
  v.push_back(Case(base, "model.name: \\x1b", [&](auto* s) { s->mutable_model()->set_name("m\x1b"); }));
  v.push_back(Case(base, "cluster.name: a newline", [&](auto* s) { s->mutable_cluster()->set_name("c\nx"); }));
  v.push_back(Case(base, "cluster.device.name: 1 MB", [&](auto* s) { s->mutable_cluster()->mutable_device()->set_name(mb); }));
  v.push_back(Case(base, "cluster.device.name: invalid UTF-8",
                   [&](auto* s) { s->mutable_cluster()->mutable_device()->set_name("\xc3\x28"); }));
  return v;
}

std::vector<SpecCase> ValidControls(const proto::JobSpec& base) {
  std::vector<SpecCase> v;
  v.push_back(Case(base, "the base job", [](auto*) {}));
  v.push_back(Case(base, "optional numeric fields 0 (= the defaults)", [](auto* s) {
    s->clear_batching();
    s->clear_schedule();
    s->clear_optimizer();
    s->set_planner_lookahead(0);
    s->set_memory_limit_mb(0);
    s->mutable_cluster()->set_intra_node_bandwidth_gbps(0);
    s->mutable_cluster()->set_inter_node_bandwidth_gbps(0);
    s->mutable_model()->set_ffn(0);
    s->mutable_model()->set_max_positions(0);
  }));
  v.push_back(Case(base, "seed = 2^64 - 1", [](auto* s) { s->set_seed(std::numeric_limits<uint64_t>::max()); }));
  v.push_back(Case(base, "batching.round_multiple = 3 with max_seq_len 1023 (rounds to itself)", [](auto* s) {
    s->mutable_batching()->set_round_multiple(3);
    s->mutable_batching()->set_max_seq_len(1023);
    s->mutable_model()->set_max_positions(1024);
  }));
  v.push_back(Case(base, "model.kind = llama with kv_heads = 2 (Llama's block written out)", [](auto* s) {
    s->mutable_model()->set_kind(proto::ModelKind::llama);
    s->mutable_model()->set_kv_heads(2);
  }));
  v.push_back(Case(base, "optimizer.lr = -0.0 (= the default)", [](auto* s) { s->mutable_optimizer()->set_lr(-0.0); }));
  v.push_back(Case(base, "cluster.inter_node_latency_us = 1e-320 (denormal)",
                   [](auto* s) { s->mutable_cluster()->set_inter_node_latency_us(1e-320); }));
  v.push_back(Case(base, "name: 256 bytes of UTF-8", [](auto* s) {
    std::string name;
    while (name.size() + 3 <= 256) name += "\xe6\x97\xa5";  // 日
    s->set_name(name);
  }));
  return v;
}

}  // namespace dynapipe::testing::hostile
