#include "runtime/executor/shared_tensors.h"

#include <string_view>
#include <utility>

#include "runtime/executor/grad_reducer.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

absl::Status SumSharedTensors(std::span<const std::unique_ptr<model::Stage>> chunks, std::span<const int> pipeline,
                              Backend* backend, comm::Communicator* comm, absl::Time deadline, int dp, int dp_rank) {
  if (chunks.empty() || pipeline.size() <= 1) return absl::OkStatus();  // one stage holds every tensor once
  const model::GptConfig& c = chunks.front()->config();
  for (const char* name : model::kEncoderDecoderShared) {
    const size_t whole = std::string_view(name) == "wte" ? static_cast<size_t>(c.vocab) * c.hidden
                                                          : static_cast<size_t>(c.relative_buckets) * c.heads;
    const GradBucket part = dp > 1 ? ShardOf({0, whole}, dp, dp_rank) : GradBucket{0, whole};
    const size_t n = part.size;
    if (n == 0) continue;  // every holder's shard is empty alike
    std::vector<float> sum(n, 0.0f), copy(n);
    std::vector<std::pair<model::Stage*, size_t>> holders;  // chunk, offset of this rank's part
    for (const auto& chunk : chunks) {
      const model::ParamInfo* p = chunk->layout().FindParam(name);
      if (p == nullptr) continue;
      holders.emplace_back(chunk.get(), p->offset + part.offset);
      RETURN_IF_ERROR(backend->CopyToHost(copy.data(), chunk->grads() + holders.back().second, n * sizeof(float)));
      for (size_t i = 0; i < n; ++i) sum[i] += copy[i];
    }
    // Through the backend's memory: NCCL reduces device buffers only.
    ASSIGN_OR_RETURN(Buffer scratch, backend->pool().Get(n * sizeof(float), backend->stream()));
    RETURN_IF_ERROR(backend->CopyFromHost(scratch.data(), sum.data(), n * sizeof(float)));
    RETURN_IF_ERROR(comm->AllReduceSum(pipeline, scratch.as<float>(), n, deadline));
    RETURN_IF_ERROR(backend->CopyToHost(sum.data(), scratch.data(), n * sizeof(float)));
    for (auto [chunk, offset] : holders) {
      RETURN_IF_ERROR(backend->CopyFromHost(chunk->grads() + offset, sum.data(), n * sizeof(float)));
    }
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::executor
