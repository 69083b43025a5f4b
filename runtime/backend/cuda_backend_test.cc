// The CUDA backend on a real device: stages, copies, the pairwise gradient
// sum, instruction timings in device time, and both communicators. Every
// case needs a device ([gpu]); the no-device error is backend_test's.

#include "runtime/backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/kernels/cuda/test_util.h"
#include "runtime/comm/kv_store.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime {
namespace {

using cuda::testing::Gate;
using cuda::testing::RandomNormal;

std::unique_ptr<Backend> MakeBackend(CommKind comm = CommKind::kDefault) {
  auto b = CreateBackend({.kind = proto::Backend::cuda, .device = 0, .comm = comm});
  INFO(b.status().ToString());
  REQUIRE(b.ok());
  REQUIRE_OK((*b)->BindThread());
  return std::move(*b);
}

cudaStream_t Stream(const Backend& b) { return reinterpret_cast<cudaStream_t>(b.stream()); }

TEST_CASE("the CUDA backend describes its device and makes bf16 stages of 18 bytes per parameter", "[gpu]") {
  std::unique_ptr<Backend> backend = MakeBackend();
  CHECK(backend->kind() == proto::Backend::cuda);
  CHECK(backend->Describe().starts_with("cuda:0 "));
  // "cuda:0 NAME (bf16, nccl; attention: ...; matmul glue: ...)"
  CHECK(backend->Describe().find(" (bf16, nccl; attention: ") != std::string::npos);
  CHECK(backend->Describe().ends_with(")"));
  CHECK(backend->activation_dtype() == model::DType::kBF16);
  const model::GptConfig c{.num_layers = 2, .hidden = 64, .heads = 2, .ffn = 128, .vocab = 40, .max_positions = 16};
  auto stage = backend->CreateStage(c, {0, 2, true, true, 5});
  REQUIRE_OK(stage.status());
  CHECK((*stage)->activation_dtype() == model::DType::kBF16);
  CHECK((*stage)->state_bytes() == (*stage)->layout().num_params() * 18);
  model::StageState st;
  REQUIRE_OK((*stage)->ExportState(&st));
  REQUIRE(st.params.size() == (*stage)->layout().num_params());
  st.params[3] = 42;
  REQUIRE_OK((*stage)->ImportState(st));
  model::StageState back;
  REQUIRE_OK((*stage)->ExportState(&back));
  CHECK(back.params[3] == 42);
  st.adam_m.pop_back();
  CHECK((*stage)->ImportState(st).code() == absl::StatusCode::kInvalidArgument);
  // What the kernels cannot run is refused naming the field.
  model::GptConfig odd = c;
  odd.ffn = 100;
  auto bad = backend->CreateStage(odd, {0, 2, true, true, 5});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("model.ffn") != absl::string_view::npos);
  stage->reset();  // before the backend
}

TEST_CASE("--device beyond the visible devices fails naming the flag", "[gpu]") {
  auto b = CreateBackend({.kind = proto::Backend::cuda, .device = 1 << 20});
  CHECK(b.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(b.status().message().find("--device") != absl::string_view::npos);
}

TEST_CASE("CUDA backend copies round-trip and SumPair leaves the fp32 sum in both copies", "[gpu]") {
  std::unique_ptr<Backend> backend = MakeBackend();
  const size_t n = 100003;
  const std::vector<float> a = RandomNormal(n, 1, 3.0f), b = RandomNormal(n, 2, 1e-3f);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  auto da = backend->pool().Get(n * sizeof(float), backend->stream());
  auto db = backend->pool().Get(n * sizeof(float), backend->stream());
  REQUIRE_OK(da.status());
  REQUIRE_OK(db.status());
  REQUIRE_OK(backend->CopyFromHost(da->data(), a.data(), n * sizeof(float)));
  REQUIRE_OK(backend->CopyFromHost(db->data(), b.data(), n * sizeof(float)));
  std::vector<float> ha(n), hb(n);
  REQUIRE_OK(backend->CopyToHost(ha.data(), da->data(), n * sizeof(float)));
  CHECK(ha == a);
  REQUIRE_OK(backend->SumPair(da->as<float>(), db->as<float>(), n));
  REQUIRE_OK(backend->Synchronize());
  REQUIRE_OK(backend->CopyToHost(ha.data(), da->data(), n * sizeof(float)));
  REQUIRE_OK(backend->CopyToHost(hb.data(), db->data(), n * sizeof(float)));
  CHECK(std::memcmp(ha.data(), want.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(hb.data(), want.data(), n * sizeof(float)) == 0);
}

TEST_CASE("CUDA instruction timings are device time: a held stream shows in the instruction that waited", "[gpu]") {
  std::unique_ptr<Backend> backend = MakeBackend();
  for (int round = 0; round < 2; ++round) {  // the second timer reuses the first's events
    INFO("round " << round);
    std::unique_ptr<InstructionTimer> timer = backend->NewTimer();
    Gate gate;
    REQUIRE_OK(timer->Begin(0));
    REQUIRE_OK(timer->End(0));
    REQUIRE_OK(timer->Begin(1));
    gate.Block(Stream(*backend));  // the device waits here until Open
    REQUIRE_OK(timer->End(1));
    REQUIRE_OK(timer->Begin(2));
    REQUIRE_OK(timer->End(2));
    CHECK(timer->End(2).code() == absl::StatusCode::kInternal);  // no second End
    // Enqueueing took microseconds; the device spends >= 100 ms in instruction 1.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate.Open();
    auto t = timer->Finish();
    REQUIRE_OK(t.status());
    REQUIRE(t->size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK((*t)[i].index() == i);
      CHECK((*t)[i].end_ms() >= (*t)[i].start_ms());
    }
    CHECK((*t)[0].start_ms() == 0.0);
    CHECK((*t)[1].start_ms() >= (*t)[0].end_ms());
    CHECK((*t)[2].start_ms() >= (*t)[1].end_ms());
    CHECK((*t)[1].end_ms() - (*t)[1].start_ms() >= 80.0);
    CHECK((*t)[2].end_ms() - (*t)[2].start_ms() < 50.0);
  }
}

TEST_CASE("one NCCL rank all-reduces a device buffer over itself through the backend's communicator", "[gpu]") {
  std::unique_ptr<Backend> backend = MakeBackend(CommKind::kNccl);
  comm::MemoryKeyValueStore store;
  auto comm = backend->Connect({.rank = 0, .size = 1, .job_prefix = "cuda-nccl/"}, &store);
  REQUIRE_OK(comm.status());
  const std::vector<float> x{1.5f, -2.0f, 3.25f};
  auto d = backend->pool().Get(x.size() * sizeof(float), backend->stream());
  auto e = backend->pool().Get(x.size() * sizeof(float), backend->stream());
  REQUIRE_OK(d.status());
  REQUIRE_OK(e.status());
  REQUIRE_OK(backend->CopyFromHost(d->data(), x.data(), x.size() * sizeof(float)));
  REQUIRE_OK(backend->CopyFromHost(e->data(), x.data(), x.size() * sizeof(float)));
  // Queued on the compute stream and not waited for: the all-reduce must be
  // ordered after it (the sum over one rank is its input, 2x).
  REQUIRE_OK(backend->SumPair(d->as<float>(), e->as<float>(), x.size()));
  REQUIRE_OK((*comm)->AllReduceSum(std::vector<int>{0}, d->as<float>(), x.size(), absl::Now() + absl::Seconds(30)));
  std::vector<float> got(x.size());
  REQUIRE_OK(backend->CopyToHost(got.data(), d->data(), got.size() * sizeof(float)));
  CHECK(got == std::vector<float>{3.0f, -4.0f, 6.5f});
  comm->reset();
}

TEST_CASE("two CUDA backends on one device exchange and sum device buffers over host-staged Gloo", "[gpu]") {
  std::unique_ptr<Backend> backends[2] = {MakeBackend(CommKind::kGloo), MakeBackend(CommKind::kGloo)};
  CHECK(backends[0]->Describe().find(" (bf16, gloo; attention: ") != std::string::npos);
  comm::MemoryKeyValueStore store;
  constexpr size_t n = 1000;
  absl::Status status[2];
  std::vector<float> summed[2], received(n, -1.0f);
  auto rank = [&](int r) -> absl::Status {
    Backend& b = *backends[r];
    RETURN_IF_ERROR(b.BindThread());
    ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c,
                     b.Connect({.rank = r, .size = 2, .job_prefix = "cuda-gloo/"}, &store));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(r + 1) * static_cast<float>(i);
    ASSIGN_OR_RETURN(Buffer d, b.pool().Get(n * sizeof(float), b.stream()));
    RETURN_IF_ERROR(b.CopyFromHost(d.data(), x.data(), n * sizeof(float)));
    if (r == 0) {
      ASSIGN_OR_RETURN(std::unique_ptr<comm::Request> send, c->Send(1, 3, d.data(), n * sizeof(float)));
      RETURN_IF_ERROR(send->Wait(deadline));
    } else {
      ASSIGN_OR_RETURN(Buffer in, b.pool().Get(n * sizeof(float), b.stream()));
      ASSIGN_OR_RETURN(std::unique_ptr<comm::Request> recv, c->Recv(0, 3, in.data(), n * sizeof(float)));
      RETURN_IF_ERROR(recv->Wait(deadline));
      RETURN_IF_ERROR(b.CopyToHost(received.data(), in.data(), n * sizeof(float)));
    }
    RETURN_IF_ERROR(c->AllReduceSum(std::vector<int>{0, 1}, d.as<float>(), n, deadline));
    summed[r].resize(n);
    return b.CopyToHost(summed[r].data(), d.data(), n * sizeof(float));
  };
  std::thread t0([&] { status[0] = rank(0); });
  std::thread t1([&] { status[1] = rank(1); });
  t0.join();
  t1.join();
  REQUIRE_OK(status[0]);
  REQUIRE_OK(status[1]);
  for (size_t i = 0; i < n; ++i) {
    INFO("i=" << i);
    REQUIRE(received[i] == static_cast<float>(i));
    REQUIRE(summed[0][i] == 3.0f * static_cast<float>(i));
    REQUIRE(summed[1][i] == summed[0][i]);
  }
}

}  // namespace
}  // namespace dynapipe::runtime
