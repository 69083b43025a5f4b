#include "runtime/kernels/cuda/cudnn_attention.h"

#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <memory>
#include <vector>

#include "runtime/kernels/cuda/attention_probe.h"

namespace dynapipe::runtime::cuda {
namespace {

TEST_CASE("a cuDNN batch holds each sequence's length and its offsets into qkv, out and the statistics") {
  constexpr int64_t B = 2, T = 5, C = 8, NH = 2;
  const std::vector<int32_t> seg = {0, 0, 0, 1, -1,  // two samples, then padding
                                    4, 4, 4, 4, 4};  // one full row
  auto b = MakeCudnnAttentionBatch(seg.data(), B, T, C, NH);
  REQUIRE(b.ok());
  CHECK(b->bucket == RaggedBucket{kMinBucketSequences, kMinBucketLength});
  CHECK(b->lengths == std::vector<int32_t>{3, 1, 5, 0, 0, 0, 0, 0});
  REQUIRE(b->qkv_offsets.size() == 9);
  CHECK(b->qkv_offsets[0] == 0);
  CHECK(b->qkv_offsets[1] == 3 * 3 * C);
  CHECK(b->qkv_offsets[2] == 5 * 3 * C);
  CHECK(b->qkv_offsets[8] == 10 * 3 * C);
  CHECK(b->out_offsets[2] == 5 * C);
  CHECK(b->stats_offsets[1] == 3 * NH);

  // The packed block reads back through Locate as the host arrays.
  std::vector<unsigned char> block(b->DeviceBytes());
  b->Pack(block.data());
  const CudnnAttention::DeviceBatch d = CudnnAttention::Locate(*b, block.data());
  for (size_t i = 0; i < b->qkv_offsets.size(); ++i) {
    CHECK(d.qkv_offsets[i] == b->qkv_offsets[i]);
    CHECK(d.out_offsets[i] == b->out_offsets[i]);
    CHECK(d.stats_offsets[i] == b->stats_offsets[i]);
  }
  for (size_t i = 0; i < b->lengths.size(); ++i) CHECK(d.lengths[i] == b->lengths[i]);
  for (const void* p : {static_cast<const void*>(d.out_offsets), static_cast<const void*>(d.stats_offsets),
                        static_cast<const void*>(d.lengths)}) {
    CHECK((static_cast<const unsigned char*>(p) - block.data()) % 256 == 0);
  }
}

TEST_CASE("a split segment makes no cuDNN batch; head dimensions are multiples of 8 up to 128") {
  const std::vector<int32_t> split = {0, 1, 0};
  CHECK(MakeCudnnAttentionBatch(split.data(), 1, 3, 8, 1).status().code() == absl::StatusCode::kFailedPrecondition);
  for (int64_t hd : {8, 32, 64, 128}) CHECK(CudnnAttentionSupportsHeadDim(hd));
  for (int64_t hd : {0, 4, 12, 136, 256}) CHECK_FALSE(CudnnAttentionSupportsHeadDim(hd));
}

TEST_CASE("graph keys: micro-batches of one bucket share a graph, passes and shapes do not") {
  const std::vector<int32_t> a = {0, 0, 0, 1, 1, -1};
  const std::vector<int32_t> b = {0, 1, 2, 3, 4, 5};
  auto ba = MakeCudnnAttentionBatch(a.data(), 1, 6, 64, 1);
  auto bb = MakeCudnnAttentionBatch(b.data(), 1, 6, 64, 1);
  REQUIRE(ba.ok());
  REQUIRE(bb.ok());
  CHECK(ba->bucket == bb->bucket);  // 2 and 6 sequences, both <= 8 of <= 64 tokens
  const CudnnAttentionKey fwd{false, ba->bucket.sequences, ba->bucket.max_len, 1, 64};
  CudnnAttentionKey bwd = fwd;
  bwd.backward = true;
  CudnnAttentionKey wider = fwd;
  wider.head_dim = 128;
  CHECK(fwd < bwd);
  CHECK(fwd != wider);
  CHECK(fwd == CudnnAttentionKey{false, bb->bucket.sequences, bb->bucket.max_len, 1, 64});
}

// cuDNN is loadable wherever the project builds with CUDA (the toolkit here,
// Python's nvidia-cudnn on a GPU machine): no device is needed to check that
// every tensor and operation descriptor of both graphs finalizes.
TEST_CASE("both attention graphs' descriptors finalize in the loaded cuDNN, without a device") {
  absl::StatusOr<const CudnnApi*> api = LoadCudnn();
  if (!api.ok()) {
    WARN("cuDNN not loadable here: " << api.status().message());
    CHECK(api.status().code() == absl::StatusCode::kFailedPrecondition);
    return;
  }
  INFO("cuDNN " << (*api)->VersionString() << " at " << (*api)->library_path);
  CHECK((*api)->version / 10000 == 9);
  for (const int64_t hd : {64, 128}) {
    const CudnnAttentionKey fwd{false, 16, 512, 4, hd};
    auto f = CheckCudnnAttentionOps(**api, fwd);
    INFO("forward, head dim " << hd << ": " << f.status().message());
    REQUIRE(f.ok());
    CHECK(*f == 20);
    CudnnAttentionKey bwd = fwd;
    bwd.backward = true;
    auto b = CheckCudnnAttentionOps(**api, bwd);
    INFO("backward, head dim " << hd << ": " << b.status().message());
    REQUIRE(b.ok());
    CHECK(*b == 28);
  }
  // A failing call names the library version and what failed.
  const absl::Status e = (*api)->Error(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(tensor q)");
  CHECK(e.message().find("cuDNN 9.") == 0);
  CHECK(e.message().find("tensor q") != absl::string_view::npos);
  CHECK(e.message().find("CUDNN_STATUS_BAD_PARAM") != absl::string_view::npos);
  CHECK(CudnnAttributeName(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC) == "TENSOR_RAGGED_OFFSET_DESC");
}

// An H100 SXM5 in cuDNN's device-property JSON (its keys as cuDNN 9.19
// reads them; values from the published H100 SXM5 specification: 132 SMs,
// 50 MB L2, 228 KB shared memory per SM of which 227 KB per block opt-in,
// 1,980 MHz boost, HBM3 at 2,619 MHz, 80 GB; "deviceVer" 900 is sm_90 as
// cuDNN writes it in its engine configurations).
constexpr const char* kH100 = R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
 "regsPerBlock": 65536, "multiProcessorCount": 132, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
 "maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
 "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 0, "isTccDriver": 0,
 "supportCoopLaunch": 1, "smClockRateKHz": 1980000, "memClockRateKHz": 2619000, "l2CacheSize": 52428800,
 "deviceName": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045231616, "cudaDeviceId": 0, "deviceVer": 900,
 "driverVer": 13000})";

// cuDNN loads its compiled kernels with the driver. Without one (CI), the
// toolkit's stub libcuda (soname libcuda.so.1) stands in: everything up to
// that load runs, the load fails. With a driver present nothing is loaded.
bool LibcudaPresent() {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr) return true;
  return dlopen("/usr/local/cuda/lib64/stubs/libcuda.so", RTLD_NOW | RTLD_GLOBAL) != nullptr;
}

TEST_CASE("cuDNN's fusion engines take both attention graphs and compile them for an H100, without a device") {
  absl::StatusOr<const CudnnApi*> api = LoadCudnn();
  if (!api.ok() || (*api)->version < 90800 || !LibcudaPresent()) {
    WARN("deviceless planning needs cuDNN >= 9.8 and a libcuda (driver or the toolkit's stub)");
    return;
  }
  struct Shape {
    int64_t sequences, max_len, heads, head_dim;
  };
  // GPT-350M's and GPT-1.3B's heads; many short sequences, a few long ones.
  for (const Shape& sh : {Shape{16, 512, 16, 64}, Shape{4096, 64, 16, 64}, Shape{512, 8192, 16, 64},
                          Shape{8, 64, 32, 128}, Shape{1024, 16384, 16, 128}}) {
    for (const bool backward : {false, true}) {
      const CudnnAttentionKey key{backward, sh.sequences, sh.max_len, sh.heads, sh.head_dim};
      auto r = PlanCudnnAttentionDeviceless(**api, key, kH100);
      INFO((backward ? "backward " : "forward ") << sh.sequences << " x " << sh.max_len << ", " << sh.heads
                                                 << " heads of " << sh.head_dim << ": " << r.status().message());
      REQUIRE(r.ok());
      // The pattern matched: the heuristic offers engines (none for a graph
      // they do not recognise, e.g. fp32 probabilities into the P v product).
      CHECK(r->configs > 0);
      // Each configuration passed the support checks and compiled; only the
      // load into a driver failed (or, with a driver, one became a plan).
      for (const std::string& f : r->failures) {
        INFO(f);
        CHECK(f.find("cuLibraryLoadData") != std::string::npos);
      }
      CHECK(r->finalized + static_cast<int64_t>(r->failures.size()) >= 1);
    }
  }
}

// ---------------------------------------------------------------- [gpu]

// seg (B, T): row b holds samples of lengths rows[b], then padding.
std::vector<int32_t> Rows(int64_t T, const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> seg(rows.size() * T, -1);
  for (size_t b = 0; b < rows.size(); ++b) {
    int64_t t = 0;
    for (size_t s = 0; s < rows[b].size(); ++s) {
      for (int64_t k = 0; k < rows[b][s]; ++k) seg[b * T + t++] = static_cast<int32_t>(s);
    }
  }
  return seg;
}

struct Gpu {
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudnnAttention> attention;
  explicit Gpu(CudnnGraphOptions options = {}) {
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    auto api = LoadCudnn();
    REQUIRE(api.ok());
    auto a = CudnnAttention::Create(*api, stream, options);
    INFO(a.status().message());
    REQUIRE(a.ok());
    attention = std::move(*a);
  }
  ~Gpu() {
    attention.reset();
    cudaStreamDestroy(stream);
  }
  absl::Status Compare(const std::vector<int32_t>& seg, int64_t B, int64_t T, int64_t NH, int hd, uint64_t seed) {
    return CompareCudnnWithTiled(*attention, seg, B, T, NH, hd, seed, stream, std::chrono::seconds(60));
  }
};

TEST_CASE("cuDNN attention passes the start-up check for head dimensions 64 and 128", "[gpu]") {
  Gpu g;
  for (int hd : {64, 128}) {
    const absl::Status s = ProbeCudnnAttention(*g.attention, hd, g.stream, std::chrono::seconds(60));
    INFO("head dim " << hd << ": " << s.message());
    CHECK(s.ok());
  }
}

struct Case {
  const char* name;
  int64_t T, NH;
  int hd;
  std::vector<std::vector<int64_t>> rows;
};
std::vector<Case> Cases() {
  return {Case{"padded", 200, 2, 64, {{200}, {137}, {64}, {}}},
          Case{"packed", 333, 2, 128, {{50, 17, 100, 90, 60}, {1, 63, 65, 130, 74}}},
          Case{"one token", 1, 1, 64, {{1}}},
          Case{"many short", 700, 4, 64, {std::vector<int64_t>(70, 10)}},
          Case{"long rows", 4100, 2, 128, {{4100}, {900, 3000, 200}}}};
}

TEST_CASE("cuDNN attention matches the tiled kernel on padded, packed and one-token batches", "[gpu]") {
  Gpu g;
  for (const Case& c : Cases()) {
    const absl::Status s = g.Compare(Rows(c.T, c.rows), static_cast<int64_t>(c.rows.size()), c.T, c.NH, c.hd, 77);
    INFO(c.name << ": " << s.message());
    CHECK(s.ok());
  }
}

// A diagnostic for a GPU session, hidden from plain runs: one backward graph
// declaration (CudnnGraphOptions, bits from DYNAPIPE_CUDNN_VARIANT) on every
// case above, one line per case. One variant per process, since an illegal
// address ends the CUDA context:
//   DYNAPIPE_CUDNN_VARIANT=5 cudnn_attention_test "cuDNN backward graph declarations*"
// (deploy/cudnn_variants.sh runs them all)
TEST_CASE("cuDNN backward graph declarations side by side (diagnostic)", "[.variants][gpu]") {
  const char* env = std::getenv("DYNAPIPE_CUDNN_VARIANT");
  const int bits = env == nullptr ? 0 : std::atoi(env);
  REQUIRE(bits >= 0);
  REQUIRE(bits < CudnnGraphOptions::kVariants);
  const CudnnGraphOptions options = CudnnGraphOptions::FromBits(bits);
  Gpu g(options);
  for (const Case& c : Cases()) {
    const absl::Status s = g.Compare(Rows(c.T, c.rows), static_cast<int64_t>(c.rows.size()), c.T, c.NH, c.hd, 77);
    std::printf("variant %d (%s), %s: %s\n", bits, options.ToString().c_str(), c.name,
                s.ok() ? "ok" : std::string(s.message()).c_str());
    std::fflush(stdout);
  }
}

TEST_CASE("micro-batches of one bucket reuse its graphs", "[gpu]") {
  Gpu g;
  REQUIRE(g.Compare(Rows(100, {{40, 60}, {100}}), 2, 100, 2, 64, 1).ok());
  const size_t graphs = g.attention->cached_graphs();
  CHECK(graphs == 2);  // forward and backward
  REQUIRE(g.Compare(Rows(100, {{30, 30, 30}, {99}}), 2, 100, 2, 64, 2).ok());
  CHECK(g.attention->cached_graphs() == graphs);
  REQUIRE(g.Compare(Rows(300, {{300}}), 1, 300, 2, 64, 3).ok());  // longer: a new bucket
  CHECK(g.attention->cached_graphs() == graphs + 2);
}

}  // namespace
}  // namespace dynapipe::runtime::cuda
