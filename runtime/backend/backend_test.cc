#include "runtime/backend/backend.h"

#include <catch2/catch.hpp>
#include <vector>

namespace dynapipe::runtime {
namespace {

TEST_CASE("the cpu backend makes fp32 stages with the layout's state, and copies and sums like memory", "[backend]") {
  auto backend = CreateBackend({.kind = proto::Backend::cpu});
  REQUIRE(backend.ok());
  CHECK((*backend)->activation_dtype() == model::DType::kF32);
  model::GptConfig c{.num_layers = 2, .hidden = 32, .heads = 4, .ffn = 64, .vocab = 40, .max_positions = 16};
  auto stage = (*backend)->CreateStage(c, {0, 2, true, true, 5});
  REQUIRE(stage.ok());
  CHECK((*stage)->layout().num_params() > 0);
  CHECK((*stage)->state_bytes() == (*stage)->layout().num_params() * 16);
  model::StageState st;
  REQUIRE((*stage)->ExportState(&st).ok());
  CHECK(st.params.size() == (*stage)->layout().num_params());
  CHECK(st.adam_m == std::vector<float>(st.params.size(), 0.0f));
  st.params[3] = 42;
  REQUIRE((*stage)->ImportState(st).ok());
  model::StageState back;
  REQUIRE((*stage)->ExportState(&back).ok());
  CHECK(back.params[3] == 42);
  st.adam_v.pop_back();
  CHECK((*stage)->ImportState(st).code() == absl::StatusCode::kInvalidArgument);

  std::vector<float> a{1, 2, 3}, b{10, 20, 30}, h(3);
  REQUIRE((*backend)->SumPair(a.data(), b.data(), 3).ok());
  CHECK(a == std::vector<float>{11, 22, 33});
  CHECK(b == a);
  REQUIRE((*backend)->CopyToHost(h.data(), a.data(), 3 * sizeof(float)).ok());
  CHECK(h == a);
}

TEST_CASE("backend and comm flags: unknown names and impossible pairs fail in one line naming the flag", "[backend]") {
  CHECK(ParseBackendKind("tpu").status().message().find("--backend") != std::string::npos);
  CHECK(*ParseBackendKind("cuda") == proto::Backend::cuda);
  CHECK(ParseCommKind("mpi").status().message().find("--comm") != std::string::npos);
  CHECK(*ParseCommKind("nccl") == CommKind::kNccl);
  auto nccl_on_cpu = CreateBackend({.kind = proto::Backend::cpu, .comm = CommKind::kNccl});
  CHECK(nccl_on_cpu.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(nccl_on_cpu.status().message().find("--comm nccl") != std::string::npos);
}

TEST_CASE("A program linking :backends carries the CUDA backend exactly where the build has CUDA", "[backend]") {
  // The backend registers itself when linked; a registration the linker
  // dropped would leave dynapipe-executor without --backend cuda.
#ifdef DYNAPIPE_WITH_CUDA
  CHECK(CudaBackendBuilt());
#else
  CHECK_FALSE(CudaBackendBuilt());
#endif
}

TEST_CASE("--backend cuda without a usable GPU fails at once with one clear line", "[backend]") {
  // On a machine with a GPU (and a CUDA build) the backend starts instead;
  // that case belongs to the [gpu] tests.
  auto cuda = CreateBackend({.kind = proto::Backend::cuda});
  if (cuda.ok()) {
    SUCCEED("a CUDA device is visible: " << (*cuda)->Describe());
    return;
  }
  CHECK(cuda.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string msg(cuda.status().message());
  CHECK(msg.starts_with("--backend cuda: "));
  CHECK(msg.find('\n') == std::string::npos);
  if (CudaBackendBuilt()) {
    CHECK(msg.find("no CUDA device") != std::string::npos);
  } else {
    CHECK(msg.find("no CUDA backend") != std::string::npos);
  }
}

}  // namespace
}  // namespace dynapipe::runtime
