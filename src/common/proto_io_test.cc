#include "src/common/proto_io.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "proto/cost_profile.pb.h"
#include "proto/job.pb.h"
#include "src/common/file_util.h"

namespace dynapipe {
namespace {

using Catch::Matchers::Contains;

std::string TempFile(const std::string& name, const std::string& contents) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + std::to_string(::getpid()) + "_" + name;
  REQUIRE(WriteFileAtomic(path, contents).ok());
  return path;
}

TEST_CASE("Text config loads") {
  const std::string path = TempFile("job.pbtxt", R"(
name: "tiny"
model { kind: gpt num_layers: 2 hidden: 64 heads: 4 vocab: 128 }
parallelism { pp: 2 dp: 2 }
batching { method: dynamic global_batch_tokens: 4096 }
iterations: 10
)");
  proto::JobSpec job;
  REQUIRE(LoadProtoFile(path, &job).ok());
  CHECK(job.name() == "tiny");
  CHECK(job.model().kind() == proto::ModelKind::gpt);
  CHECK(job.parallelism().dp() == 2);
  CHECK(job.batching().method() == proto::BatchingSpec::dynamic);
}

TEST_CASE("A text config with an unknown field names the file, line and field") {
  const std::string path = TempFile("bad.pbtxt", "name: \"x\"\niterations: 3\niters: 5\n");
  proto::JobSpec job;
  const absl::Status s = LoadProtoFile(path, &job);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains(path + ":3:") && Contains("\"iters\""));
}

TEST_CASE("A text config with a wrongly typed value names the field") {
  const std::string path = TempFile("bad2.pbtxt", "model {\n  hidden: \"wide\"\n}\n");
  proto::JobSpec job;
  const absl::Status s = LoadProtoFile(path, &job);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains(path + ":2:") && Contains("hidden"));
}

TEST_CASE("A text config with a bad enum value names the value") {
  const std::string path = TempFile("bad3.pbtxt", "batching {\n  method: fastest\n}\n");
  proto::JobSpec job;
  const absl::Status s = LoadProtoFile(path, &job);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains(":2:") && Contains("fastest"));
}

TEST_CASE("A JSON config with an unknown field names the file, line and field") {
  const std::string path = TempFile("bad.json", "{\n  \"device\": \"h100\",\n  \"hiddenn\": 12\n}\n");
  proto::CostProfile profile;
  const absl::Status s = LoadProtoFile(path, &profile);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains(path + ":3:") && Contains("hiddenn"));
}

TEST_CASE("A JSON config with a bad nested enum names the field path") {
  const std::string path = TempFile("bad2.json", R"({
  "device": "h100",
  "layers": [
    {"kind": "encoder", "param_mb": 1},
    {"kind": "attention", "param_mb": 2}
  ]
})");
  proto::CostProfile profile;
  const absl::Status s = LoadProtoFile(path, &profile);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains("layers[1].kind"));
}

TEST_CASE("Malformed JSON is rejected with the file name") {
  const std::string path = TempFile("broken.json", "{\"device\": ");
  proto::CostProfile profile;
  const absl::Status s = LoadProtoFile(path, &profile);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains(path));
}

TEST_CASE("Unknown extensions and missing files are clear errors") {
  proto::JobSpec job;
  const std::string path = TempFile("job.yaml", "name: x\n");
  const absl::Status ext = LoadProtoFile(path, &job);
  CHECK(ext.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(ext.message()), Contains(".yaml") || Contains("extension"));
  CHECK(LoadProtoFile("/nonexistent/job.pbtxt", &job).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("ToJson prints snake_case names and lower-case enums") {
  proto::JobSpec job;
  job.mutable_batching()->set_global_batch_tokens(65536);
  job.mutable_model()->set_kind(proto::ModelKind::t5);
  const std::string json = ToJson(job);
  CHECK_THAT(json, Contains("\"global_batch_tokens\":\"65536\"") && Contains("\"kind\":\"t5\""));
  proto::JobSpec back;
  REQUIRE(ParseJsonProto(json, "inline", &back).ok());
  CHECK(back.batching().global_batch_tokens() == 65536);
}

TEST_CASE("A JSON syntax error is one line naming the file, without an excerpt of it") {
  proto::JobSpec job;
  const absl::Status s = ParseJsonProto("{\"name\": \"secret-value\"\n}\n}\n", "job.json", &job);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  const std::string m(s.message());
  CHECK(m.rfind("job.json: ", 0) == 0);
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.find("secret") == std::string::npos);
}

}  // namespace
}  // namespace dynapipe
