#include "runtime/kernels/cuda/attention_choice.h"

#include <catch2/catch.hpp>

namespace dynapipe::runtime::cuda {
namespace {

CudnnFacts Good() {
  CudnnFacts f;
  f.version = 91900;
  f.sm = 90;
  f.probes = {{64, absl::OkStatus()}, {128, absl::OkStatus()}};
  return f;
}

TEST_CASE("--attention-kernel parses its three names and refuses others, naming the flag") {
  CHECK(*ParseAttentionImpl("auto") == AttentionImpl::kAuto);
  CHECK(*ParseAttentionImpl("cudnn") == AttentionImpl::kCudnn);
  CHECK(*ParseAttentionImpl("tiled") == AttentionImpl::kTiled);
  auto bad = ParseAttentionImpl("flash");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("--attention-kernel") != absl::string_view::npos);
  for (AttentionImpl i : {AttentionImpl::kAuto, AttentionImpl::kCudnn, AttentionImpl::kTiled}) {
    CHECK(*ParseAttentionImpl(AttentionImplName(i)) == i);
  }
}

TEST_CASE("auto takes cuDNN for the head dimensions whose start-up check passed") {
  CudnnFacts f = Good();
  f.probes[1].result = absl::InternalError("dq differs by 0.5");
  auto d = DecideAttention(AttentionImpl::kAuto, f);
  REQUIRE(d.ok());
  CHECK(d->cudnn_head_dims == std::vector<int>{64});
  CHECK(d->line.find("cudnn 9.19.0") != std::string::npos);
  CHECK(d->line.find("head dimension 128: dq differs") != std::string::npos);
}

TEST_CASE("auto falls back to the tiled kernel with the reason; cudnn then fails to start") {
  struct Case {
    const char* what;
    CudnnFacts facts;
    const char* reason;
  };
  CudnnFacts missing = Good();
  missing.loaded = absl::FailedPreconditionError("cuDNN is not loadable (libcudnn.so.9: no such file)");
  CudnnFacts old = Good();
  old.version = 90500;
  CudnnFacts ampere = Good();
  ampere.sm = 80;
  ampere.version = 91700;
  CudnnFacts failing = Good();
  for (auto& p : failing.probes) p.result = absl::InternalError("no engine");
  CudnnFacts unprobed = Good();
  unprobed.probes.clear();
  for (const Case& c : {Case{"missing", missing, "not loadable"}, Case{"old", old, "older than 9.6.0"},
                        Case{"ampere", ampere, "on sm_80 only from 9.18.1"}, Case{"failing", failing, "no engine"},
                        Case{"unprobed", unprobed, "did not run"}}) {
    INFO(c.what);
    auto d = DecideAttention(AttentionImpl::kAuto, c.facts);
    REQUIRE(d.ok());
    CHECK(d->cudnn_head_dims.empty());
    CHECK(d->line.find("tiled (cuDNN not used: ") == 0);
    CHECK(d->line.find(c.reason) != std::string::npos);
    auto strict = DecideAttention(AttentionImpl::kCudnn, c.facts);
    CHECK(strict.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(strict.status().message().find("--attention-kernel cudnn") != absl::string_view::npos);
    CHECK(strict.status().message().find(c.reason) != absl::string_view::npos);
  }
  // Newer cuDNN runs packed attention below sm_90 too.
  ampere.version = 91801;
  CHECK(CudnnPrerequisites(ampere).ok());
}

TEST_CASE("tiled is taken as asked, whatever cuDNN offers") {
  auto d = DecideAttention(AttentionImpl::kTiled, Good());
  REQUIRE(d.ok());
  CHECK(d->cudnn_head_dims.empty());
  CHECK(d->line == "tiled (--attention-kernel tiled)");
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
