// Every message of every contract survives binary and JSON round trips with
// all fields set to random non-default values (found by reflection, so new
// messages and fields are covered without touching this test).
#include <catch2/catch.hpp>
#include <random>
#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/checkpoint.pb.h"
#include "proto/cluster.pb.h"
#include "proto/cost_profile.pb.h"
#include "proto/dataset.pb.h"
#include "proto/job.pb.h"
#include "proto/model.pb.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"
#include "proto/services.pb.h"

namespace dynapipe::proto {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::vector<const Descriptor*> AllMessages() {
  std::set<const google::protobuf::FileDescriptor*> files = {
      ModelSpec::descriptor()->file(),     ClusterSpec::descriptor()->file(),
      CostProfile::descriptor()->file(),   JobSpec::descriptor()->file(),
      ExecutionPlan::descriptor()->file(), IterationReport::descriptor()->file(),
      JobStatus::descriptor()->file(),     DatasetInfo::descriptor()->file(),
      CheckpointHeader::descriptor()->file(),
  };
  std::vector<const Descriptor*> out;
  std::function<void(const Descriptor*)> add = [&](const Descriptor* d) {
    out.push_back(d);
    for (int i = 0; i < d->nested_type_count(); ++i) add(d->nested_type(i));
  };
  for (const auto* f : files) {
    for (int i = 0; i < f->message_type_count(); ++i) add(f->message_type(i));
  }
  return out;
}

class Filler {
 public:
  explicit Filler(uint32_t seed) : rng_(seed) {}

  void Fill(Message* m, int depth) {
    const Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->containing_oneof() != nullptr) continue;  // handled below
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && depth >= 3) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < 2; ++k) AddOne(m, r, f, depth);
      } else {
        SetOne(m, r, f, depth);
      }
    }
    for (int o = 0; o < d->oneof_decl_count(); ++o) {
      const auto* oneof = d->oneof_decl(o);
      const FieldDescriptor* f = oneof->field(Pick(oneof->field_count()));
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && depth >= 3) continue;
      SetOne(m, r, f, depth);
    }
  }

 private:
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  int64_t Int() { return std::uniform_int_distribution<int64_t>(1, 1'000'000)(rng_); }
  double Real() { return std::uniform_real_distribution<double>(0.001, 1e6)(rng_); }
  std::string Str() { return "s" + std::to_string(Int()) + "\xc3\xa9\"\\"; }
  int EnumValue(const FieldDescriptor* f) {
    const auto* e = f->enum_type();
    return e->value(1 + Pick(e->value_count() - 1))->number();  // never the zero default
  }

  void SetOne(Message* m, const Reflection* r, const FieldDescriptor* f, int depth) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, static_cast<int32_t>(Int())); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, Int() * 1'000'003); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, static_cast<uint32_t>(Int())); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, 0xF000'0000'0000'0000ull + Int()); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, Real()); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, static_cast<float>(Real())); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(m, f, EnumValue(f)); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, Str()); break;
      case FieldDescriptor::CPPTYPE_MESSAGE: Fill(r->MutableMessage(m, f), depth + 1); break;
    }
  }

  void AddOne(Message* m, const Reflection* r, const FieldDescriptor* f, int depth) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(m, f, static_cast<int32_t>(Int())); break;
      case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(m, f, Int()); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(m, f, static_cast<uint32_t>(Int())); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(m, f, Int()); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(m, f, Real()); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(m, f, static_cast<float>(Real())); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(m, f, EnumValue(f)); break;
      case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, Str()); break;
      case FieldDescriptor::CPPTYPE_MESSAGE: Fill(r->AddMessage(m, f), depth + 1); break;
    }
  }

  std::mt19937 rng_;
};

TEST_CASE("Every contract message round-trips through binary and JSON") {
  const auto messages = AllMessages();
  REQUIRE(messages.size() >= 40);
  auto* factory = google::protobuf::MessageFactory::generated_factory();
  int filled = 0;
  for (const Descriptor* d : messages) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      INFO(d->full_name() << " seed " << seed);
      std::unique_ptr<Message> original(factory->GetPrototype(d)->New());
      Filler(seed * 7919 + d->field_count()).Fill(original.get(), 0);
      if (d->field_count() > 0) {
        CHECK(original->ByteSizeLong() > 0);
        ++filled;
      }

      std::string wire;
      REQUIRE(original->SerializeToString(&wire));
      std::unique_ptr<Message> from_wire(original->New());
      REQUIRE(from_wire->ParseFromString(wire));
      CHECK(google::protobuf::util::MessageDifferencer::Equals(*original, *from_wire));

      std::string json;
      google::protobuf::util::JsonPrintOptions print;
      print.preserve_proto_field_names = true;
      REQUIRE(google::protobuf::util::MessageToJsonString(*original, &json, print).ok());
      std::unique_ptr<Message> from_json(original->New());
      REQUIRE(google::protobuf::util::JsonStringToMessage(json, from_json.get()).ok());
      CHECK(google::protobuf::util::MessageDifferencer::Equals(*original, *from_json));
    }
  }
  CHECK(filled >= 3 * 30);
}

TEST_CASE("A truncated binary plan does not parse as the original") {
  ExecutionPlan plan;
  Filler(11).Fill(&plan, 0);
  std::string wire;
  REQUIRE(plan.SerializeToString(&wire));
  REQUIRE(wire.size() > 10);
  ExecutionPlan back;
  const bool parsed = back.ParseFromString(wire.substr(0, wire.size() - 3));
  CHECK_FALSE((parsed && google::protobuf::util::MessageDifferencer::Equals(plan, back)));
}

TEST_CASE("The documented CostProfile JSON shape parses") {
  const std::string json = R"({
    "device": "h100-sxm",
    "model_kind": "gpt",
    "hidden": 4096,
    "heads": 32,
    "ffn": 16384,
    "layers": [
      {"kind": "encoder", "param_mb": 384.5,
       "points": [{"mbs": 1, "seq": 512, "dec_seq": 0, "fw_ms": 1.25, "bw_ms": 2.5,
                   "stored_activation_mb": 40.0, "peak_activation_mb": 60.0},
                  {"mbs": 2, "seq": 1024, "dec_seq": 0, "fw_ms": 4.0, "bw_ms": 8.0,
                   "stored_activation_mb": 160.0, "peak_activation_mb": 220.0}]},
      {"kind": "decoder", "param_mb": 512, "points": []},
      {"kind": "postprocess", "param_mb": 500.0,
       "points": [{"mbs": 1, "seq": 512, "fw_ms": 0.9, "bw_ms": 1.8,
                   "stored_activation_mb": 10, "peak_activation_mb": 30}]},
      {"kind": "embedding", "param_mb": 500.0, "points": []}
    ]
  })";
  CostProfile profile;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &profile);
  REQUIRE(status.ok());
  CHECK(profile.device() == "h100-sxm");
  CHECK(profile.model_kind() == ModelKind::gpt);
  CHECK(profile.hidden() == 4096);
  CHECK(profile.heads() == 32);
  CHECK(profile.ffn() == 16384);
  REQUIRE(profile.layers_size() == 4);
  CHECK(profile.layers(0).kind() == LayerProfile::encoder);
  CHECK(profile.layers(1).kind() == LayerProfile::decoder);
  CHECK(profile.layers(2).kind() == LayerProfile::postprocess);
  CHECK(profile.layers(3).kind() == LayerProfile::embedding);
  CHECK(profile.layers(0).param_mb() == 384.5);
  REQUIRE(profile.layers(0).points_size() == 2);
  const CostPoint& p = profile.layers(0).points(1);
  CHECK(p.mbs() == 2);
  CHECK(p.seq() == 1024);
  CHECK(p.fw_ms() == 4.0);
  CHECK(p.bw_ms() == 8.0);
  CHECK(p.stored_activation_mb() == 160.0);
  CHECK(p.peak_activation_mb() == 220.0);
}

TEST_CASE("CostProfile JSON rejects an unknown layer kind") {
  CostProfile profile;
  const auto status = google::protobuf::util::JsonStringToMessage(
      R"({"layers": [{"kind": "attention"}]})", &profile);
  CHECK_FALSE(status.ok());
}

}  // namespace
}  // namespace dynapipe::proto
