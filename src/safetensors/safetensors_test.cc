// The safetensors reader and writer: round trips (every float dtype widened
// exactly), the layout the format prescribes, and one refusal per way a
// header can lie, each one line naming what was wrong.
#include "src/safetensors/safetensors.h"
#include "src/safetensors/weight_set.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/common/file_util.h"
#include "src/testing/status_require.h"
#include "src/testing/temp_dir.h"

namespace dynapipe::safetensors {
namespace {

// A file of the given JSON header and `data_bytes` zero bytes of data.
std::string Raw(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int k = 0; k < 8; ++k, n >>= 8) out[k] = static_cast<char>(n & 0xFF);
  return out + header + std::string(data_bytes, '\0');
}

std::string Refusal(const std::string& bytes) {
  auto r = Reader::FromBytes(bytes, "m.safetensors");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string msg(r.status().message());
  CHECK(msg.find('\n') == std::string::npos);  // one line
  CHECK(msg.rfind("m.safetensors: ", 0) == 0);  // names the file
  return msg;
}

bool Has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST_CASE("safetensors round trip: tensors, shapes, metadata, on disk and in memory") {
  const std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  const std::vector<float> b = {42.0f};
  const std::vector<TensorOut> out = {F32Tensor("h.0.attn.c_attn.weight", {2, 3}, a), F32Tensor("scalar", {}, b)};
  auto bytes = Serialize(out, {{"format", "pt"}});
  REQUIRE_OK(bytes.status());
  // The layout: an 8-byte length, a header padded to 8 bytes, the data.
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes->size() == 8 + n + (a.size() + b.size()) * 4);
  CHECK(Has(bytes->substr(8, n), R"("h.0.attn.c_attn.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"));

  const std::string dir = dynapipe::testing::FreshTempDir("safetensors_rt");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/rt.safetensors";
  REQUIRE_OK(Write(path, out, {{"format", "pt"}}));
  for (bool on_disk : {true, false}) {
    INFO("on disk " << on_disk);
    auto r = on_disk ? Reader::Open(path) : Reader::FromBytes(*bytes);
    REQUIRE_OK(r.status());
    REQUIRE(r->tensors().size() == 2);
    CHECK(r->tensors()[0].shape == std::vector<int64_t>{2, 3});
    CHECK(r->tensors()[1].shape.empty());
    CHECK(r->metadata().at("format") == "pt");
    auto got = r->ReadF32("h.0.attn.c_attn.weight");
    REQUIRE_OK(got.status());
    CHECK(*got == a);
    CHECK(*r->ReadF32("scalar") == b);
    CHECK(r->ReadF32("missing").status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("safetensors widens F16, BF16 and F64 to float32 exactly") {
  // 1.0, -2.0, 65504 (the largest half), a subnormal half (2^-24), 0.5 in F16.
  const uint16_t half[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3800};
  const uint16_t bf[] = {0x3F80, 0xC040, 0x0000};  // 1.0, -3.0, 0.0
  const double f64[] = {0.1, -1e10};
  const std::vector<TensorOut> out = {
      {"h", DType::kF16, {5}, {reinterpret_cast<const char*>(half), sizeof(half)}},
      {"b", DType::kBF16, {3}, {reinterpret_cast<const char*>(bf), sizeof(bf)}},
      {"d", DType::kF64, {2}, {reinterpret_cast<const char*>(f64), sizeof(f64)}},
      {"i", DType::kI32, {1}, {reinterpret_cast<const char*>(f64), 4}}};
  auto bytes = Serialize(out);
  REQUIRE_OK(bytes.status());
  auto r = Reader::FromBytes(*bytes);
  REQUIRE_OK(r.status());
  CHECK(*r->ReadF32("h") == std::vector<float>{1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f, 0.5f});
  CHECK(*r->ReadF32("b") == std::vector<float>{1.0f, -3.0f, 0.0f});
  CHECK(*r->ReadF32("d") == std::vector<float>{0.1f, -1e10f});
  CHECK(Has(std::string(r->ReadF32("i").status().message()), "is I32, not a floating-point type"));
}

TEST_CASE("safetensors refuses every lying header in one line") {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE_OK(Reader::FromBytes(Raw(ok, 8)).status());
  CHECK(Has(Refusal("abc"), "too short"));
  CHECK(Has(Refusal(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}"), "above the limit"));
  CHECK(Has(Refusal(std::string("\x40\0\0\0\0\0\0\0", 8) + "{}"), "runs past the file"));
  CHECK(Has(Refusal(Raw(ok, 4)), "outside the 4 data bytes"));
  CHECK(Has(Refusal(Raw(ok, 12)), "last 4 bytes belong to no tensor"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8)), "unknown dtype \"F31\""));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)), "make 12 bytes"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)), "outside"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8)),
            "overlaps"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)), "a hole"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{}})", 8)), "duplicate key"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)), "unsupported value"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8)), "not an integer"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
                        R"("data_offsets":[0,8]}})",
                        8)),
            "shape too large"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8)), "unknown field"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[2]}})", 8)), "needs dtype, shape and data_offsets"));
  CHECK(Has(Refusal(Raw(R"({"__metadata__":{"k":3}})", 0)), "not a string"));
  CHECK(Has(Refusal(Raw(R"([[[[[[1]]]]]])", 0)), "nested too deeply"));
  CHECK(Has(Refusal(Raw(R"({"a":"\ud800"})", 0)), "lone surrogate"));
  CHECK(Has(Refusal(Raw(R"({"a":1} x)", 0)), "trailing bytes"));
  CHECK(Has(Refusal(Raw("{\"a\x01\":1}", 0)), "control character"));
  CHECK(Has(Refusal(Raw("[1]", 0)), "not a JSON object"));
  CHECK(Has(Refusal(Raw(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4)), "rank 9"));
  // Escapes decode: a name with a quote and a non-ASCII character.
  auto r = Reader::FromBytes(Raw(R"({"q\"\u00e9":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})", 1));
  REQUIRE_OK(r.status());
  CHECK(r->tensors()[0].name == "q\"\xc3\xa9");
}

TEST_CASE("safetensors writer refuses names and sizes it cannot write, and leaves no file") {
  const std::vector<float> a = {1, 2};
  CHECK(Has(std::string(Serialize(std::vector<TensorOut>{F32Tensor("x", {3}, a)}).status().message()),
            "do not match its shape"));
  CHECK(Has(std::string(Serialize(std::vector<TensorOut>{F32Tensor("x", {2}, a), F32Tensor("x", {2}, a)})
                            .status()
                            .message()),
            "repeated"));
  CHECK(!Serialize(std::vector<TensorOut>{F32Tensor("__metadata__", {2}, a)}).ok());
  const std::string dir = dynapipe::testing::FreshTempDir("safetensors_refused");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/refused.safetensors";
  CHECK(!Write(path, std::vector<TensorOut>{F32Tensor("x", {5}, a)}).ok());
  CHECK(::access(path.c_str(), F_OK) != 0);
  CHECK(Reader::Open(path).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("A weight set: one file, a folder with model.safetensors, or shards listed by an index") {
  namespace fs = std::filesystem;
  const std::string dir = dynapipe::testing::FreshTempDir("weight_set");
  fs::create_directories(dir + "/single");
  fs::create_directories(dir + "/sharded");
  fs::create_directories(dir + "/empty");
  const std::vector<float> a = {1, 2, 3}, b = {4, 5};
  REQUIRE_OK(Write(dir + "/single/model.safetensors", std::vector<TensorOut>{F32Tensor("a", {3}, a), F32Tensor("b", {2}, b)}));
  REQUIRE_OK(WriteFileAtomic(dir + "/single/config.json", R"({"model_type": "gpt2", "n_head": 4})"));
  REQUIRE_OK(Write(dir + "/sharded/model-00001-of-00002.safetensors", std::vector<TensorOut>{F32Tensor("a", {3}, a)}));
  REQUIRE_OK(Write(dir + "/sharded/model-00002-of-00002.safetensors", std::vector<TensorOut>{F32Tensor("b", {2}, b)}));
  const std::string index = R"({"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors", )"
                            R"("b": "model-00002-of-00002.safetensors"}})";
  REQUIRE_OK(WriteFileAtomic(dir + "/sharded/model.safetensors.index.json", index));
  for (const std::string& p : {dir + "/single", dir + "/sharded", dir + "/single/model.safetensors"}) {
    INFO(p);
    auto w = WeightSet::Open(p);
    REQUIRE_OK(w.status());
    CHECK(w->size() == 2);
    CHECK(*w->ReadF32("b") == b);
    CHECK(w->Find("a")->shape == std::vector<int64_t>{3});
    CHECK(w->Find("c") == nullptr);
    CHECK(w->config_json().empty() == (p != dir + "/single"));
  }
  auto says = [](const absl::Status& s, const std::string& what) {
    INFO(s.message());
    return !s.ok() && std::string(s.message()).find(what) != std::string::npos &&
           std::string(s.message()).find('\n') == std::string::npos;
  };
  CHECK(says(WeightSet::Open(dir + "/empty").status(), "holds neither model.safetensors"));
  CHECK(says(WeightSet::Open(dir + "/nope").status(), "No such file"));
  REQUIRE_OK(WriteFileAtomic(dir + "/sharded/model.safetensors.index.json",
                             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})"));
  CHECK(says(WeightSet::Open(dir + "/sharded").status(), "tensor c is not in model-00002-of-00002.safetensors"));
  REQUIRE_OK(WriteFileAtomic(dir + "/sharded/model.safetensors.index.json", R"({"weight_map": {"a": "../single/model.safetensors"}})"));
  CHECK(says(WeightSet::Open(dir + "/sharded").status(), "outside the folder"));
  REQUIRE_OK(WriteFileAtomic(dir + "/sharded/model.safetensors.index.json",
                             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})"));
  REQUIRE_OK(Write(dir + "/sharded/model-00002-of-00002.safetensors", std::vector<TensorOut>{F32Tensor("a", {3}, a), F32Tensor("b", {2}, b)}));
  CHECK(says(WeightSet::Open(dir + "/sharded").status(), "tensor a is in another file too"));
  REQUIRE_OK(WriteFileAtomic(dir + "/sharded/model.safetensors.index.json", R"({"weight_map": 3})"));
  CHECK(says(WeightSet::Open(dir + "/sharded").status(), "weight_map is not an object"));
}

}  // namespace
}  // namespace dynapipe::safetensors
