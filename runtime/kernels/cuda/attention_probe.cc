#include "runtime/kernels/cuda/attention_probe.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/attention.h"
#include "runtime/device/cuda_status.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;

uint16_t ToBf16Bits(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Device allocations freed on every return path.
class DeviceArrays {
 public:
  ~DeviceArrays() {
    for (void* p : owned_) cudaFree(p);
  }
  template <typename T>
  absl::StatusOr<T*> Take(size_t count) {
    void* p = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 256)));
    owned_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> owned_;
};

// max |a - b| over the real tokens' elements, relative to max(1, max |b|).
struct Diff {
  double worst = 0, scale = 1;
  double relative() const { return worst / scale; }
};

}  // namespace

absl::Status ProbeCudnnAttention(CudnnAttention& attention, int head_dim, cudaStream_t stream,
                                 std::chrono::seconds timeout) {
  constexpr int64_t B = 2, T = 160, NH = 2;
  std::vector<int32_t> seg(static_cast<size_t>(B * T), -1);
  auto fill = [&](int64_t row, int64_t from, int64_t count, int32_t id) {
    for (int64_t t = from; t < from + count; ++t) seg[static_cast<size_t>(row * T + t)] = id;
  };
  fill(0, 0, 100, 0);  // row 0: 100 + 37 tokens, then 23 of padding
  fill(0, 100, 37, 1);
  fill(1, 0, 1, 0);  // row 1: a one-token sample, then 90 + 69
  fill(1, 1, 90, 1);
  fill(1, 91, 69, 2);
  return CompareCudnnWithTiled(attention, seg, B, T, NH, head_dim, 1234, stream, timeout);
}

absl::Status CompareCudnnWithTiled(CudnnAttention& attention, const std::vector<int32_t>& seg, int64_t B, int64_t T,
                                   int64_t NH, int head_dim, uint64_t seed, cudaStream_t stream,
                                   std::chrono::seconds timeout) {
  const int64_t C = NH * head_dim, N = B * T;
  if (static_cast<int64_t>(seg.size()) != N) return absl::InvalidArgumentError("CompareCudnnWithTiled: seg size");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> qkv(static_cast<size_t>(N * 3 * C)), dout(static_cast<size_t>(N * C));
  for (auto& x : qkv) x = ToBf16Bits(normal(rng));
  for (auto& x : dout) x = ToBf16Bits(normal(rng));

  DeviceArrays mem;
  ASSIGN_OR_RETURN(bf16 * d_qkv, mem.Take<bf16>(qkv.size()));
  ASSIGN_OR_RETURN(bf16 * d_dout, mem.Take<bf16>(dout.size()));
  ASSIGN_OR_RETURN(int32_t * d_seg, mem.Take<int32_t>(seg.size()));
  ASSIGN_OR_RETURN(bf16 * out_ref, mem.Take<bf16>(dout.size()));
  ASSIGN_OR_RETURN(bf16 * out_new, mem.Take<bf16>(dout.size()));
  ASSIGN_OR_RETURN(float* lse_ref, mem.Take<float>(static_cast<size_t>(N * NH)));
  ASSIGN_OR_RETURN(float* lse_new, mem.Take<float>(static_cast<size_t>(N * NH)));
  ASSIGN_OR_RETURN(bf16 * dqkv_ref, mem.Take<bf16>(qkv.size()));
  ASSIGN_OR_RETURN(bf16 * dqkv_new, mem.Take<bf16>(qkv.size()));
  ASSIGN_OR_RETURN(float* scratch,
                         mem.Take<float>(static_cast<size_t>(AttentionBackwardScratchElements(B, T, C, NH))));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_dout, dout.data(), dout.size() * 2, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_seg, seg.data(), seg.size() * 4, cudaMemcpyHostToDevice, stream));
  for (bf16* p : {out_new, dqkv_ref, dqkv_new}) {
    const size_t bytes = (p == out_new ? dout.size() : qkv.size()) * 2;
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, bytes, stream));
  }

  // The reference: the tiled kernel.
  RETURN_IF_ERROR(AttentionForward(out_ref, lse_ref, d_qkv, d_seg, B, T, C, NH, AttentionMode::kVarlen, stream));
  RETURN_IF_ERROR(AttentionBackward(dqkv_ref, d_dout, d_qkv, out_ref, lse_ref, d_seg, B, T, C, NH,
                                          AttentionMode::kVarlen, scratch, stream));
  // cuDNN.
  ASSIGN_OR_RETURN(const CudnnAttentionBatch batch, MakeCudnnAttentionBatch(seg.data(), B, T, C, NH));
  std::vector<unsigned char> block(batch.DeviceBytes());
  batch.Pack(block.data());
  ASSIGN_OR_RETURN(unsigned char* d_block, mem.Take<unsigned char>(block.size()));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_block, block.data(), block.size(), cudaMemcpyHostToDevice, stream));
  const CudnnAttention::DeviceBatch arrays = CudnnAttention::Locate(batch, d_block);
  ASSIGN_OR_RETURN(const size_t fwd_ws, attention.ForwardWorkspace(batch, B, T, C, NH));
  ASSIGN_OR_RETURN(const size_t bwd_ws, attention.BackwardWorkspace(batch, B, T, C, NH));
  ASSIGN_OR_RETURN(unsigned char* ws, mem.Take<unsigned char>(std::max(fwd_ws, bwd_ws)));
  RETURN_IF_ERROR(
      attention.Forward(out_new, lse_new, d_qkv, batch, arrays, B, T, C, NH, ws, std::max(fwd_ws, bwd_ws), stream));
  RETURN_IF_ERROR(attention.Backward(dqkv_new, d_dout, d_qkv, out_new, lse_new, batch, arrays, B, T, C, NH, ws,
                                           std::max(fwd_ws, bwd_ws), stream));

  std::vector<uint16_t> o_ref(dout.size()), o_new(dout.size()), g_ref(qkv.size()), g_new(qkv.size());
  std::vector<float> l_ref(static_cast<size_t>(N * NH)), l_new(l_ref.size());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(o_ref.data(), out_ref, o_ref.size() * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(o_new.data(), out_new, o_new.size() * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g_ref.data(), dqkv_ref, g_ref.size() * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g_new.data(), dqkv_new, g_new.size() * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l_ref.data(), lse_ref, l_ref.size() * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l_new.data(), lse_new, l_new.size() * 4, cudaMemcpyDeviceToHost, stream));
  cudaEvent_t done = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(done, stream);
  const absl::Status waited =
      recorded == cudaSuccess ? WaitForEvent(done, timeout, "cuDNN attention check") : CudaStatus(recorded, "record");
  cudaEventDestroy(done);
  RETURN_IF_ERROR(waited);

  // Compare on real tokens; padding must stay as it was (zeros).
  Diff out_d, grad_d, lse_d, part_d[3];  // part_d: dq, dk, dv
  std::string padding;
  for (int64_t n = 0; n < N; ++n) {
    const bool real = seg[static_cast<size_t>(n)] >= 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(n * C + c);
      if (!real) {
        if (o_new[i] != 0 && padding.empty()) padding = absl::StrCat("out of padding token ", n, " was written");
        continue;
      }
      const double r = FromBf16Bits(o_ref[i]), v = FromBf16Bits(o_new[i]);
      out_d.worst = std::max(out_d.worst, std::abs(r - v));
      out_d.scale = std::max(out_d.scale, std::abs(r));
    }
    for (int64_t c = 0; c < 3 * C; ++c) {
      const size_t i = static_cast<size_t>(n * 3 * C + c);
      if (!real) {
        if (g_new[i] != 0 && padding.empty()) padding = absl::StrCat("dqkv of padding token ", n, " was written");
        continue;
      }
      const double r = FromBf16Bits(g_ref[i]), v = FromBf16Bits(g_new[i]);
      for (Diff* d : {&grad_d, &part_d[c / C]}) {
        d->worst = std::max(d->worst, std::abs(r - v));
        d->scale = std::max(d->scale, std::abs(r));
      }
    }
    if (!real) continue;
    const int64_t b = n / T, t = n % T;
    for (int64_t h = 0; h < NH; ++h) {
      const double r = l_ref[static_cast<size_t>((b * NH + h) * T + t)], v = l_new[static_cast<size_t>(n * NH + h)];
      lse_d.worst = std::max(lse_d.worst, std::abs(r - v));
      lse_d.scale = std::max(lse_d.scale, std::abs(r));
    }
  }
  if (!padding.empty()) return absl::InternalError(absl::StrCat("cuDNN attention check: ", padding));
  // bf16 keeps 8 bits: a few rounding steps of the largest value.
  struct Check {
    const char* name;
    const Diff& d;
    double tolerance;
  };
  for (const Check& c : {Check{"out", out_d, 2e-2}, Check{"statistics", lse_d, 1e-3}, Check{"dqkv", grad_d, 3e-2}}) {
    if (!(c.d.relative() <= c.tolerance)) {  // NaN fails too
      return absl::InternalError(absl::StrCat("cuDNN attention check: ", c.name, " differs from the tiled kernel by ",
                                              c.d.worst, " (", c.d.relative(), " of its largest value ", c.d.scale,
                                              ", tolerance ", c.tolerance, ")",
                                              &c.d == &grad_d ? absl::StrCat("; relative: dq ", part_d[0].relative(),
                                                                             ", dk ", part_d[1].relative(), ", dv ",
                                                                             part_d[2].relative())
                                                              : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::cuda
