#include "runtime/executor/checkpointer.h"

#include <map>
#include <new>

#include "absl/strings/str_cat.h"
#include "src/common/checkpoint_layout.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

// One shard being written: the host copy it is written from, and the result.
struct Checkpointer::Write {
  std::vector<model::StageState> states;  // per chunk
  checkpoint::ShardRef shard;             // views of `states`
  absl::Status status;
};

Checkpointer::Checkpointer(std::string dir, checkpoint::ShardInfo info, std::function<bool()> cancelled)
    : dir_(std::move(dir)), info_(info), cancelled_(std::move(cancelled)) {}

Checkpointer::~Checkpointer() { (void)Wait(); }

absl::Status Checkpointer::Restore(int64_t iteration, Worker& worker) {
  ASSIGN_OR_RETURN(const checkpoint::Shard shard, checkpoint::ReadShard(dir_, iteration, info_.rank));
  RETURN_IF_ERROR(checkpoint::CheckSameJob(info_, shard));
  auto by_name = [](const std::vector<checkpoint::Tensor>& tensors) {
    std::map<std::string, const std::vector<float>*> out;
    for (const auto& t : tensors) out[t.name] = &t.data;
    return out;
  };
  const auto params = by_name(shard.params), m = by_name(shard.adam_m), v = by_name(shard.adam_v);
  for (const auto& chunk : worker.chunks()) {
    const model::GptLayout& layout = chunk->layout();
    model::StageState state;
    for (auto* dst : {&state.params, &state.adam_m, &state.adam_v}) dst->assign(layout.num_params(), 0.0f);
    for (const model::ParamInfo& p : layout.params()) {
      for (auto [from, to] : {std::pair{&params, &state.params}, {&m, &state.adam_m}, {&v, &state.adam_v}}) {
        auto it = from->find(p.name);
        if (it == from->end() || it->second->size() != p.size) {
          return absl::DataLossError(absl::StrCat(checkpoint::ShardPath(dir_, iteration, info_.rank),
                                                  ": lacks tensor ", p.name, " of ", p.size, " values"));
        }
        std::copy(it->second->begin(), it->second->end(), to->begin() + p.offset);
      }
    }
    RETURN_IF_ERROR(chunk->ImportState(state));
  }
  worker.set_optimizer_step(shard.optimizer_step);
  return absl::OkStatus();
}

absl::Status Checkpointer::Begin(int64_t iteration, Worker& worker, std::function<void()> written) {
  RETURN_IF_ERROR(Wait());
  auto w = std::make_unique<Write>();
  static_cast<checkpoint::ShardInfo&>(w->shard) = info_;
  w->shard.iteration = iteration;
  w->shard.optimizer_step = worker.optimizer_step();
  w->states.resize(worker.chunks().size());
  size_t bytes = 0;  // the copy: parameters and both moments, fp32
  for (const auto& chunk : worker.chunks()) {
    bytes += size_t{checkpoint_layout::kCopyBytesPerParam} * chunk->layout().num_params();
  }
  try {
    for (size_t c = 0; c < worker.chunks().size(); ++c) {
      RETURN_IF_ERROR(worker.chunks()[c]->ExportState(&w->states[c]));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("rank ", info_.rank, " (pipeline stage ", info_.pp_rank,
                                                     "): checkpoint of iteration ", iteration,
                                                     ": out of host memory for its copy of the stage's state (",
                                                     bytes >> 20, " MiB)"));
  }
  // Views only once every state is in place (the vector no longer moves).
  for (size_t c = 0; c < worker.chunks().size(); ++c) {
    const model::StageState& st = w->states[c];
    for (const model::ParamInfo& p : worker.chunks()[c]->layout().params()) {
      w->shard.params.push_back({p.name, std::span<const float>(st.params).subspan(p.offset, p.size)});
      w->shard.adam_m.push_back({p.name, std::span<const float>(st.adam_m).subspan(p.offset, p.size)});
      w->shard.adam_v.push_back({p.name, std::span<const float>(st.adam_v).subspan(p.offset, p.size)});
    }
  }
  write_ = std::move(w);
  thread_ = std::thread([this, w = write_.get(), written = std::move(written)] {
    w->status = checkpoint::WriteShard(dir_, w->shard, cancelled_);
    if (w->status.ok() && written) written();
  });
  return absl::OkStatus();
}

absl::Status Checkpointer::Wait() {
  if (!thread_.joinable()) return absl::OkStatus();
  thread_.join();
  absl::Status s = write_->status;
  write_.reset();
  return s;
}

}  // namespace dynapipe::runtime::executor
