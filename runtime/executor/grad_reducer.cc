#include "runtime/executor/grad_reducer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

std::vector<GradBucket> MakeBuckets(const model::GptLayout& layout, size_t min_size) {
  const model::StageOptions& o = layout.options();
  const auto& layers = layout.layers();
  const size_t n = layout.num_params();
  // A T5 stage reports every gradient at the end of its backward: buckets
  // as large as its ownership regions lose no overlap.
  if (layout.config().encoder_decoder) return OwnershipRegions(layout);
  // What follows a layer's parameters in the layout.
  const size_t tail = o.last ? layout.lnf_w() : n;
  auto layer_end = [&](size_t i) { return i + 1 < layers.size() ? layers[i + 1].ln1_w : tail; };
  struct Unit {
    GradBucket run;
    bool alone = false;
  };
  std::vector<Unit> units;  // in the order backward completes them
  if (o.last) units.push_back({{layout.lnf_w(), n - layout.lnf_w()}, false});
  const size_t wte_size = static_cast<size_t>(layout.config().vocab) * layout.config().hidden;
  if (o.last && layout.config().tie_embeddings && !o.first) units.push_back({{layout.wte(), wte_size}, true});
  for (size_t i = layers.size(); i-- > 0;) units.push_back({{layers[i].ln1_w, layer_end(i) - layers[i].ln1_w}, false});
  if (o.first) {
    // wpe (absent with rotary positions) joins the first layer's bucket; wte stands alone.
    const size_t after = layers.empty() ? tail : layers[0].ln1_w;
    const bool wpe = layout.wpe() != model::GptLayout::kAbsent;
    if (wpe) units.push_back({{layout.wpe(), after - layout.wpe()}, false});
    units.push_back({{layout.wte(), (wpe ? layout.wpe() : after) - layout.wte()}, true});
  }
  std::vector<GradBucket> out;
  bool open = false;  // out.back() may still grow
  for (const Unit& u : units) {
    if (u.run.size == 0) continue;
    if (u.alone) {
      out.push_back(u.run);
      open = false;
      continue;
    }
    // Units come in descending offsets, each ending where the open bucket begins.
    if (open && out.back().size < min_size && u.run.offset + u.run.size == out.back().offset) {
      out.back().offset = u.run.offset;
      out.back().size += u.run.size;
    } else {
      out.push_back(u.run);
      open = true;
    }
  }
  return out;
}

GradBucket ShardOf(const GradBucket& run, int members, int index) {
  const size_t begin = comm::ShardBegin(run.size, members, index);
  return {run.offset + begin, comm::ShardBegin(run.size, members, index + 1) - begin};
}

std::vector<GradBucket> OwnershipRegions(const model::GptLayout& layout) {
  if (layout.config().encoder_decoder) {
    // Each tensor several stages hold is a region of its own, cut alike on
    // every holder (SumSharedTensors sums the shards); the runs between them
    // are regions too.
    std::vector<GradBucket> out;
    bool open = false;  // out.back() is a run of unshared tensors that may grow
    for (const model::ParamInfo& p : layout.params()) {
      const bool alone = model::IsEncoderDecoderShared(p.name);
      if (open && !alone) {
        out.back().size += p.size;
      } else {
        out.push_back({p.offset, p.size});
      }
      open = !alone;
    }
    return out;
  }
  const model::ParamInfo* wte = layout.FindParam("wte");
  if (wte == nullptr) return {{0, layout.num_params()}};
  // The token embedding leads the layout whenever a stage holds one.
  return {{wte->offset, wte->size}, {wte->offset + wte->size, layout.num_params() - wte->size}};
}

std::vector<model::ParamRun> OwnedRuns(const std::vector<GradBucket>& regions, int members, int index) {
  std::vector<model::ParamRun> out;
  for (const GradBucket& r : regions) {
    const GradBucket s = ShardOf(r, members, index);
    if (s.size > 0) out.push_back(s);
  }
  return out;
}

std::vector<size_t> ShardCounts(const GradBucket& bucket, const std::vector<GradBucket>& regions, int members) {
  std::vector<size_t> counts(members, 0);
  for (const GradBucket& r : regions) {
    for (int k = 0; k < members; ++k) {
      const GradBucket s = ShardOf(r, members, k);
      const size_t lo = std::max(s.offset, bucket.offset), hi = std::min(s.offset + s.size, bucket.offset + bucket.size);
      if (lo < hi) counts[k] += hi - lo;
    }
  }
  return counts;
}

GradReducer::GradReducer(comm::Communicator* comm, std::vector<int> group, Mode mode, std::vector<float*> grads,
                         const std::vector<std::vector<GradBucket>>* buckets,
                         const std::vector<std::vector<GradBucket>>* regions, absl::Duration timeout)
    : comm_(comm),
      group_(std::move(group)),
      mode_(mode),
      grads_(std::move(grads)),
      regions_(regions),
      timeout_(timeout) {
  for (size_t c = buckets->size(); c-- > 0;) {
    int index = 0;
    for (const GradBucket& b : (*buckets)[c]) slots_.push_back({static_cast<int>(c), index++, b, b.size, nullptr});
  }
}

GradReducer::~GradReducer() {
  for (size_t i = 0; i < next_; ++i) {
    if (slots_[i].request != nullptr) {
      comm_->Abort();  // the requests' own destructors would, one by one
      break;
    }
  }
}

absl::Status GradReducer::StartNext() {
  Slot& s = slots_[next_];
  float* data = grads_[s.chunk] + s.bucket.offset;
  const absl::Time deadline = absl::Now() + timeout_;
  absl::StatusOr<std::unique_ptr<comm::Request>> request =
      mode_ == Mode::kAllReduce
          ? comm_->StartAllReduceSum(group_, data, s.bucket.size, deadline)
          : comm_->StartReduceScatterSum(
                group_, data, ShardCounts(s.bucket, (*regions_)[s.chunk], static_cast<int>(group_.size())), deadline);
  if (!request.ok()) {
    return Annotate(request.status(), absl::StrCat("gradient bucket ", s.index, " of chunk ", s.chunk));
  }
  s.request = *std::move(request);
  if (!finishing_) ++started_early_;
  ++next_;
  return absl::OkStatus();
}

absl::Status GradReducer::Ready(int chunk, size_t offset, size_t size) {
  for (Slot& s : slots_) {
    if (s.chunk != chunk) continue;
    const size_t lo = std::max(offset, s.bucket.offset), hi = std::min(offset + size, s.bucket.offset + s.bucket.size);
    if (lo >= hi) continue;
    if (hi - lo > s.pending) {
      return absl::InternalError(absl::StrCat("chunk ", chunk, ": gradients [", offset, ", ", offset + size,
                                              ") reported final twice"));
    }
    s.pending -= hi - lo;
  }
  while (next_ < slots_.size() && slots_[next_].pending == 0) RETURN_IF_ERROR(StartNext());
  return absl::OkStatus();
}

absl::Status GradReducer::Finish() {
  finishing_ = true;
  while (next_ < slots_.size()) RETURN_IF_ERROR(StartNext());
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    const absl::Status status = s.request->Wait(absl::Now() + timeout_);
    s.request.reset();
    if (!status.ok()) return Annotate(status, absl::StrCat("gradient bucket ", s.index, " of chunk ", s.chunk));
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::executor
