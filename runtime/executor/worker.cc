#include "runtime/executor/worker.h"

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/executor/hf_init.h"
#include "src/plan/plan_seal.h"
#include "runtime/executor/shared_tensors.h"
#include "runtime/model/batch.h"
#include "runtime/optim/adamw.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

namespace {

using Clock = std::chrono::steady_clock;

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Transfer tags: both sides of a device pair see their transfers in the
// same order (the planner guarantees it), so the n-th send from A to B is
// the n-th receive at B from A. Tags also carry the iteration and a kind.
enum TagKind : uint64_t { kPipeline = 0 };
uint64_t Tag(int64_t iteration, TagKind kind, int from, int to, uint64_t n) {
  return (static_cast<uint64_t>(iteration & 0xffffff) << 40) | (static_cast<uint64_t>(kind) << 36) |
         (static_cast<uint64_t>(from < to ? 0 : 1) << 35) | (n & 0x7ffffffff);
}

const char* OpName(const proto::Instruction& ins) {
  switch (ins.op_case()) {
    case proto::Instruction::kLoadInput: return "load_input";
    case proto::Instruction::kForward: return "forward";
    case proto::Instruction::kBackward: return "backward";
    case proto::Instruction::kSendActivationStart: return "send_activation_start";
    case proto::Instruction::kSendActivationFinish: return "send_activation_finish";
    case proto::Instruction::kRecvActivationStart: return "recv_activation_start";
    case proto::Instruction::kRecvActivationFinish: return "recv_activation_finish";
    case proto::Instruction::kSendGradStart: return "send_grad_start";
    case proto::Instruction::kSendGradFinish: return "send_grad_finish";
    case proto::Instruction::kRecvGradStart: return "recv_grad_start";
    case proto::Instruction::kRecvGradFinish: return "recv_grad_finish";
    case proto::Instruction::kFreeBuffer: return "free_buffer";
    case proto::Instruction::kAllReduceGrads: return "all_reduce_grads";
    case proto::Instruction::kOptimizerStep: return "optimizer_step";
    case proto::Instruction::OP_NOT_SET: break;
  }
  return "unknown";
}

proto::DType::Value ProtoDType(model::DType d) {
  return d == model::DType::kF32 ? proto::DType::fp32 : proto::DType::bf16;
}

// Bytes of a transfer's tensors, whose element type must be the backend's.
absl::StatusOr<size_t> TransferBytes(const proto::CommOp& op, model::DType dtype) {
  int64_t total = 0;
  for (const proto::TensorShape& s : op.shapes()) {
    if (s.dtype() != proto::DType::unspecified && s.dtype() != ProtoDType(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("transfer: the plan's tensor is ",
                                                     proto::DType::Value_Name(s.dtype()), ", this backend moves ",
                                                     model::DTypeName(dtype)));
    }
    int64_t n = 1;
    for (int64_t d : s.dims()) n *= d;
    total += n;
  }
  return static_cast<size_t>(total) * model::DTypeBytes(dtype);
}

model::Recompute ToRecompute(proto::RecomputeLevel::Value v) {
  switch (v) {
    case proto::RecomputeLevel::selective: return model::Recompute::kSelective;
    case proto::RecomputeLevel::full: return model::Recompute::kFull;
    default: return model::Recompute::kNone;
  }
}

}  // namespace

struct Worker::Iter {
  int64_t iteration = 0;
  Clock::time_point start;
  float loss_scale = 0;
  std::map<int, model::TokenBatch> batches;  // by micro-batch
  std::vector<Buffer> slots;
  std::map<int, std::unique_ptr<comm::Request>> pending;  // by slot
  std::map<int, uint64_t> sent, received;                  // transfers per peer
  std::map<int, int> last_backward;                        // chunk -> its last Backward instruction
  std::unique_ptr<GradReducer> reducer;                    // data-parallel groups only
  IterationResult result;
};

Worker::Worker(const proto::JobSpec& spec, int rank, int pp, int dp, comm::Communicator* comm,
               const data::Dataset* ds, Backend* backend, WorkerOptions o)
    : spec_(spec), rank_(rank), pp_(pp), dp_(dp), comm_(comm), dataset_(ds), backend_(backend), options_(o) {}

Worker::~Worker() {
  chunks_.clear();  // stashed activations go back to the pool before anything else goes
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const spec::NormalizedJobSpec& normalized,
                                                       std::span<const int32_t> layers,
                                                       int rank, int pp_size, int dp_size, comm::Communicator* comm,
                                                       const data::Dataset* dataset, Backend* backend,
                                                       WorkerOptions options) {
  const proto::JobSpec& spec = normalized.proto();
  ASSIGN_OR_RETURN(const model::GptConfig config, model::GptConfig::FromSpec(spec.model()));
  if (layers.empty()) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": plan assigns no layers"));
  if (comm == nullptr || comm->size() != pp_size * dp_size || comm->rank() != rank) {
    return absl::InvalidArgumentError("communicator does not match the job's ranks");
  }
  if (backend == nullptr) return absl::InvalidArgumentError("worker: no backend");
  const proto::DType::Value dtype = spec.model().dtype();
  if (dtype != proto::DType::unspecified && dtype != ProtoDType(backend->activation_dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("model.dtype: ", proto::DType::Value_Name(dtype), " jobs do not run on ",
                                                   backend->Describe(), ", which computes in ",
                                                   model::DTypeName(backend->activation_dtype())));
  }
  std::unique_ptr<Worker> w(new Worker(spec, rank, pp_size, dp_size, comm, dataset, backend, options));
  // Chunks: maximal runs of consecutive layers.
  size_t i = 0;
  while (i < layers.size()) {
    size_t j = i + 1;
    while (j < layers.size() && layers[j] == layers[j - 1] + 1) ++j;
    model::StageOptions o;
    o.first_layer = layers[i];
    o.num_layers = static_cast<int>(j - i);
    o.first = o.first_layer == 0;
    o.last = o.first_layer + o.num_layers == config.TotalLayers();
    o.seed = spec.seed();
    ASSIGN_OR_RETURN(const model::GptLayout layout, model::GptLayout::Make(config, o));
    absl::StatusOr<std::unique_ptr<model::Stage>> stage;
    try {
      stage = backend->CreateStage(config, o);
    } catch (const std::bad_alloc&) {
      // fp32 weights, gradients and two Adam moments at least.
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", rank, " (layers ", o.first_layer, "-", o.first_layer + o.num_layers - 1,
          "): out of host memory creating the stage: its ", layout.num_params(), " parameters need at least ",
          layout.num_params() * 16 >> 20, " MiB for weights, gradients and Adam moments"));
    }
    if (!stage.ok()) return stage.status();
    w->chunks_.push_back(std::move(*stage));
    i = j;
  }
  if (!w->options_.init_from.empty()) RETURN_IF_ERROR(InitFromHuggingFace(w->options_.init_from, w->chunks_));
  // The job's declared device memory bounds the rank: its model state (which
  // the planner's memory model counts too), the rest for buffers.
  if (spec.memory_limit_mb() > 0) {
    const size_t limit = static_cast<size_t>(spec.memory_limit_mb() * (1 << 20));
    size_t state = 0;
    for (const auto& c : w->chunks_) state += c->state_bytes();
    if (state >= limit) {
      return absl::ResourceExhaustedError(absl::StrCat("rank ", rank, ": the model state of its layers needs ",
                                                       state >> 20, " MiB, more than memory_limit_mb ",
                                                       spec.memory_limit_mb()));
    }
    backend->LimitMemory(limit - state, absl::StrCat("memory_limit_mb ", spec.memory_limit_mb(), " less ",
                                                    state >> 20, " MiB of model state"));
  }
  // Ranks are dp_rank * pp + pp_rank.
  w->dp_rank_ = rank / pp_size;
  for (int g = 0; g < dp_size; ++g) w->dp_group_.push_back(g * pp_size + rank % pp_size);
  w->zero1_ = spec.optimizer().zero1();
  // Buckets pay only where collectives overlap backward; elsewhere one per
  // chunk (and its token embedding) is the fewest calls.
  const size_t bucket_elements =
      comm->overlaps_collectives()
          ? std::max<size_t>(1, static_cast<size_t>(spec.parallelism().grad_bucket_mb() * 1e6 / sizeof(float)))
          : std::numeric_limits<size_t>::max();
  for (const auto& c : w->chunks_) {
    w->buckets_.push_back(MakeBuckets(c->layout(), bucket_elements));
    w->regions_.push_back(OwnershipRegions(c->layout()));
    if (w->sharded()) RETURN_IF_ERROR(c->ShardOptimizer(OwnedRuns(w->regions_.back(), dp_size, w->dp_rank_)));
  }
  return w;
}

absl::StatusOr<IterationResult> Worker::RunIteration(const proto::ExecutionPlan& plan) {
  Iter it;
  RETURN_IF_ERROR(BeginIteration(plan, &it));
  BufferPool& pool = backend_->pool();
  pool.ResetPeak();
  std::unique_ptr<InstructionTimer> timer = backend_->NewTimer();
  RETURN_IF_ERROR(RunInstructions(plan, &it, *timer));
  // Plan bugs and a device that does not finish fail the iteration like any
  // instruction: the communicator is aborted, so peers do not wait out their
  // deadlines for transfers this rank dropped.
  const int last = plan.instructions_size();  // "end of plan"
  if (absl::Status s = CheckPlanDrained(it); !s.ok()) return FailIteration(plan, s, last);
  absl::StatusOr<std::vector<proto::InstructionTiming>> timings = timer->Finish();  // waits for the device's work
  if (!timings.ok()) return FailIteration(plan, timings.status(), last);
  it.result.timings = std::move(*timings);
  for (const auto& [mb, batch] : it.batches) it.result.tokens += batch.real_tokens;
  it.slots.clear();
  size_t state_bytes = 0;
  for (const auto& c : chunks_) state_bytes += c->state_bytes();
  const PoolStats stats = pool.stats();
  auto with_state_mb = [state_bytes](size_t pool_bytes) {
    return static_cast<double>(pool_bytes + state_bytes) / (1 << 20);
  };
  it.result.peak_memory_mb = with_state_mb(stats.peak_in_use_bytes);
  it.result.peak_reserved_mb = with_state_mb(stats.peak_reserved_bytes);
  it.result.peak_class_mb = with_state_mb(stats.peak_class_bytes);
  it.result.memory_fragmentation = stats.Fragmentation();
  it.result.iteration_ms = MsBetween(it.start, Clock::now());
  return std::move(it.result);
}

absl::Status Worker::BeginIteration(const proto::ExecutionPlan& plan, Iter* it) {
  if (plan.rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("plan for rank ", plan.rank(), " given to rank ", rank_));
  }
  if (plan.global_loss_tokens() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("iteration ", plan.iteration(), ": plan has no loss tokens"));
  }
  it->iteration = plan.iteration();
  it->start = Clock::now();
  it->loss_scale = 1.0f / static_cast<float>(plan.global_loss_tokens());
  if (plan.num_buffer_slots() < 0 || plan.num_buffer_slots() > plan::kMaxBufferSlots) {
    return absl::InvalidArgumentError(absl::StrCat("iteration ", plan.iteration(), ": plan asks for ",
                                                   plan.num_buffer_slots(), " buffer slots"));
  }
  it->slots.resize(static_cast<size_t>(plan.num_buffer_slots()));
  for (int i = 0; i < plan.instructions_size(); ++i) {
    if (plan.instructions(i).has_backward()) it->last_backward[plan.instructions(i).chunk()] = i;
  }
  if (dp_ > 1) {
    std::vector<float*> grads;
    for (const auto& c : chunks_) grads.push_back(c->grads());
    it->reducer = std::make_unique<GradReducer>(
        comm_, dp_group_, sharded() ? GradReducer::Mode::kReduceScatter : GradReducer::Mode::kAllReduce,
        std::move(grads), &buckets_, &regions_, options_.comm_timeout);
  }
  return absl::OkStatus();
}

absl::Status Worker::RunInstructions(const proto::ExecutionPlan& plan, Iter* it, InstructionTimer& timer) {
  // Runs of transfer starts are issued as one group: NCCL launches them
  // together (an exchange with one peer cannot deadlock, and they overlap
  // the compute that follows); a no-op for Gloo.
  auto is_start = [&](int i) {
    if (i < 0 || i >= plan.instructions_size()) return false;
    const auto op = plan.instructions(i).op_case();
    return op == proto::Instruction::kSendActivationStart || op == proto::Instruction::kSendGradStart ||
           op == proto::Instruction::kRecvActivationStart || op == proto::Instruction::kRecvGradStart;
  };
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const bool group_start = is_start(i) && !is_start(i - 1), group_end = is_start(i) && !is_start(i + 1);
    if (options_.stopped && options_.stopped()) return FailIteration(plan, absl::CancelledError("stopped"), i);
    absl::Status s = timer.Begin(i);
    if (s.ok() && group_start) s = comm_->GroupStart();
    if (s.ok()) s = Execute(plan, i, it);
    if (s.ok() && group_end) s = comm_->GroupEnd();
    if (s.ok()) s = timer.End(i);
    if (!s.ok()) return FailIteration(plan, s, i);
  }
  return absl::OkStatus();
}

absl::Status Worker::CheckPlanDrained(const Iter& it) const {
  for (const auto& [slot, req] : it.pending) {
    return absl::InternalError(absl::StrCat("transfer on slot ", slot, " never finished (plan bug)"));
  }
  if (it.reducer != nullptr) return absl::InternalError("gradients never reduced: no all_reduce_grads (plan bug)");
  for (const auto& c : chunks_) {
    if (c->in_flight() != 0) return absl::InternalError("micro-batches forwarded but never backwarded (plan bug)");
  }
  return absl::OkStatus();
}

absl::Status Worker::FailIteration(const proto::ExecutionPlan& plan, const absl::Status& s, int i) {
  // Peers blocked on us must fail fast rather than wait out their deadline.
  comm_->Abort();
  if (i >= plan.instructions_size()) {
    return Annotate(s, absl::StrCat("rank ", rank_, " iteration ", plan.iteration(), " end of plan"));
  }
  return Annotate(s, absl::StrCat("rank ", rank_, " iteration ", plan.iteration(), " instruction ", i, " (",
                                  OpName(plan.instructions(i)), ")"));
}

absl::Status Worker::Execute(const proto::ExecutionPlan& plan, int index, Iter* it) {
  const proto::Instruction& ins = plan.instructions(index);
  switch (ins.op_case()) {
    case proto::Instruction::kLoadInput: {
      // Token tensors live beside the slots (every stage reads the dataset
      // itself); the slot only marks the input as loaded.
      RETURN_IF_ERROR(BatchOf(plan, ins, it).status());
      return absl::OkStatus();
    }
    case proto::Instruction::kForward: return RunForward(plan, ins, it);
    case proto::Instruction::kBackward: return RunBackward(plan, index, it);
    case proto::Instruction::kSendActivationStart: return StartTransfer(ins.send_activation_start(), true, it);
    case proto::Instruction::kSendGradStart: return StartTransfer(ins.send_grad_start(), true, it);
    case proto::Instruction::kRecvActivationStart: return StartTransfer(ins.recv_activation_start(), false, it);
    case proto::Instruction::kRecvGradStart: return StartTransfer(ins.recv_grad_start(), false, it);
    case proto::Instruction::kSendActivationFinish:
      return FinishTransfer(ins.send_activation_finish().buffer_ids(0), it);
    case proto::Instruction::kSendGradFinish: return FinishTransfer(ins.send_grad_finish().buffer_ids(0), it);
    case proto::Instruction::kRecvActivationFinish:
      return FinishTransfer(ins.recv_activation_finish().buffer_ids(0), it);
    case proto::Instruction::kRecvGradFinish: return FinishTransfer(ins.recv_grad_finish().buffer_ids(0), it);
    case proto::Instruction::kFreeBuffer: return FreeBuffers(ins, it);
    case proto::Instruction::kAllReduceGrads: return AllReduceGrads(ins, it);
    case proto::Instruction::kOptimizerStep: return OptimizerStep(plan, it);
    case proto::Instruction::OP_NOT_SET: break;
  }
  return absl::InvalidArgumentError("instruction without an operation");
}

absl::StatusOr<model::Stage*> Worker::ChunkOf(const proto::Instruction& ins) {
  if (ins.chunk() < 0 || ins.chunk() >= static_cast<int>(chunks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", ins.chunk(), " is not on this rank"));
  }
  return chunks_[ins.chunk()].get();
}

absl::StatusOr<const model::TokenBatch*> Worker::BatchOf(const proto::ExecutionPlan& plan,
                                                         const proto::Instruction& ins, Iter* it) {
  const int mb = ins.micro_batch();
  if (mb < 0 || mb >= plan.micro_batches_size()) return absl::InvalidArgumentError(absl::StrCat("micro-batch ", mb));
  auto found = it->batches.find(mb);
  if (found == it->batches.end()) {
    ASSIGN_OR_RETURN(model::TokenBatch b,
                     model::BuildTokenBatch(plan.micro_batches(mb), *dataset_, spec_.model().max_positions(),
                                            spec_.model().kind() == proto::ModelKind::t5));
    found = it->batches.emplace(mb, std::move(b)).first;
  }
  return &found->second;
}

absl::StatusOr<Buffer*> Worker::Slot(int id, size_t min_bytes, Iter* it) {
  if (id < 0 || id >= static_cast<int>(it->slots.size())) return absl::InvalidArgumentError(absl::StrCat("slot ", id));
  Buffer* b = &it->slots[id];
  if (b->bytes() < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", id, " holds ", b->bytes(), " bytes, needs ", min_bytes));
  }
  return b;
}

absl::StatusOr<Buffer*> Worker::FreshSlot(int id, size_t bytes, Iter* it) {
  if (id < 0 || id >= static_cast<int>(it->slots.size())) return absl::InvalidArgumentError(absl::StrCat("slot ", id));
  if (!it->slots[id].empty() || it->pending.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", id, " is still in use"));
  }
  ASSIGN_OR_RETURN(it->slots[id], backend_->pool().Get(bytes, backend_->stream()));
  return &it->slots[id];
}

absl::Status Worker::FinishTransfer(int id, Iter* it) {
  auto p = it->pending.find(id);
  if (p == it->pending.end()) return absl::InvalidArgumentError(absl::StrCat("no transfer pending on slot ", id));
  std::unique_ptr<comm::Request> req = std::move(p->second);
  it->pending.erase(p);
  return req->Wait(Deadline());
}

absl::Status Worker::StartTransfer(const proto::CommOp& op, bool send, Iter* it) {
  if (op.buffer_ids_size() != 1) return absl::InvalidArgumentError("transfer: expected one buffer");
  ASSIGN_OR_RETURN(const size_t bytes, TransferBytes(op, backend_->activation_dtype()));
  const int id = op.buffer_ids(0);
  const int peer = op.peer();
  if (send) {
    ASSIGN_OR_RETURN(Buffer * b, Slot(id, bytes, it));
    const uint64_t tag = Tag(it->iteration, kPipeline, rank_, peer, it->sent[peer]++);
    ASSIGN_OR_RETURN(auto req, comm_->Send(peer, tag, b->data(), bytes));
    it->pending[id] = std::move(req);
  } else {
    ASSIGN_OR_RETURN(Buffer * b, FreshSlot(id, bytes, it));
    const uint64_t tag = Tag(it->iteration, kPipeline, peer, rank_, it->received[peer]++);
    ASSIGN_OR_RETURN(auto req, comm_->Recv(peer, tag, b->data(), bytes));
    it->pending[id] = std::move(req);
  }
  return absl::OkStatus();
}

absl::Status Worker::RunForward(const proto::ExecutionPlan& plan, const proto::Instruction& ins, Iter* it) {
  ASSIGN_OR_RETURN(model::Stage * st, ChunkOf(ins));
  ASSIGN_OR_RETURN(const model::TokenBatch* b, BatchOf(plan, ins, it));
  const void* in = nullptr;
  if (!st->options().first) {
    if (ins.forward().input_buffers_size() != 1) return absl::InvalidArgumentError("forward: expected one input");
    ASSIGN_OR_RETURN(Buffer * src, Slot(ins.forward().input_buffers(0), st->InputBytes(*b), it));
    in = src->data();
  }
  void* out = nullptr;
  if (!st->options().last) {
    if (ins.forward().output_buffers_size() != 1) return absl::InvalidArgumentError("forward: expected one output");
    ASSIGN_OR_RETURN(Buffer * dst, FreshSlot(ins.forward().output_buffers(0), st->OutputBytes(*b), it));
    out = dst->data();
  }
  // The loss stays with the stage (on a device) until the iteration's end.
  return st->Forward(ins.micro_batch(), *b, in, out, it->loss_scale, ToRecompute(ins.forward().recompute()));
}

absl::Status Worker::RunBackward(const proto::ExecutionPlan& plan, int index, Iter* it) {
  const proto::Instruction& ins = plan.instructions(index);
  ASSIGN_OR_RETURN(model::Stage * st, ChunkOf(ins));
  ASSIGN_OR_RETURN(const model::TokenBatch* b, BatchOf(plan, ins, it));
  const void* dout = nullptr;
  if (!st->options().last) {
    if (ins.backward().grad_input_buffers_size() != 1) return absl::InvalidArgumentError("backward: no gradient in");
    ASSIGN_OR_RETURN(Buffer * src, Slot(ins.backward().grad_input_buffers(0), st->OutputBytes(*b), it));
    dout = src->data();
  }
  void* din = nullptr;
  if (!st->options().first) {
    if (ins.backward().grad_output_buffers_size() != 1) return absl::InvalidArgumentError("backward: no gradient out");
    ASSIGN_OR_RETURN(Buffer * dst, FreshSlot(ins.backward().grad_output_buffers(0), st->InputBytes(*b), it));
    din = dst->data();
  }
  // The chunk's last backward: its gradients' reduction starts bucket by bucket.
  model::Stage::GradsReady ready;
  if (it->reducer != nullptr && comm_->overlaps_collectives() && it->last_backward[ins.chunk()] == index) {
    ready = [reducer = it->reducer.get(), chunk = ins.chunk()](size_t offset, size_t size) {
      return reducer->Ready(chunk, offset, size);
    };
  }
  return st->Backward(ins.micro_batch(), dout, din, ready);
}

absl::Status Worker::FreeBuffers(const proto::Instruction& ins, Iter* it) {
  for (int id : ins.free_buffer().buffer_ids()) {
    if (id < 0 || id >= static_cast<int>(it->slots.size())) return absl::InvalidArgumentError(absl::StrCat("slot ", id));
    if (it->pending.contains(id)) RETURN_IF_ERROR(FinishTransfer(id, it));  // never free memory a transfer still uses
    it->slots[id].Release();
  }
  return absl::OkStatus();
}

absl::Status Worker::AllReduceGrads(const proto::Instruction& ins, Iter* it) {
  const auto& peers = ins.all_reduce_grads().dp_peers();
  std::vector<int> group(peers.begin(), peers.end());
  std::sort(group.begin(), group.end());
  if (group != dp_group_ && !(group.size() <= 1 && dp_ == 1)) {
    return absl::InvalidArgumentError(absl::StrCat("all-reduce over {", absl::StrJoin(group, ","),
                                                   "}, but this rank's data-parallel group is {",
                                                   absl::StrJoin(dp_group_, ","), "}"));
  }
  if (it->reducer == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(it->reducer->Finish());
  it->result.buckets_started_early = it->reducer->started_early();
  it->reducer.reset();
  return absl::OkStatus();
}

absl::Status Worker::ExchangeTiedEmbedding(const proto::ExecutionPlan& plan) {
  if (chunks_.front()->config().encoder_decoder) {
    std::vector<int> pipeline(pp_);
    std::iota(pipeline.begin(), pipeline.end(), plan.dp_rank() * pp_);
    return SumSharedTensors(chunks_, pipeline, backend_, comm_, Deadline(), sharded() ? dp_ : 1, dp_rank_);
  }
  model::Stage* first = nullptr;
  model::Stage* last = nullptr;
  for (auto& c : chunks_) {
    if (!c->layout().HasSharedEmbedding()) continue;
    (c->options().first ? first : last) = c.get();
  }
  // Under ZeRO-1 only this rank's shard of the embedding's bucket (a bucket
  // of its own on both ends, so both ends cut it alike) is reduced.
  auto part = [&](model::Stage* s) {
    const model::ParamInfo* p = s->layout().FindParam("wte");
    const GradBucket whole{p->offset, p->size};
    return sharded() ? ShardOf(whole, dp_, dp_rank_) : whole;
  };
  if (first != nullptr && last != nullptr) {  // both copies on this device
    return backend_->SumPair(first->grads() + part(first).offset, last->grads() + part(last).offset,
                             part(first).size);
  }
  model::Stage* mine = first != nullptr ? first : last;
  if (mine == nullptr) return absl::OkStatus();
  // The other copy sits on the group's other end of the pipeline: both ends
  // sum their copies (one addition per element, so both get the same bits).
  const int base = plan.dp_rank() * pp_;
  const int pair[2] = {base, base + pp_ - 1};
  return comm_->AllReduceSum(pair, mine->grads() + part(mine).offset, part(mine).size, Deadline());
}

absl::Status Worker::OptimizerStep(const proto::ExecutionPlan& plan, Iter* it) {
  RETURN_IF_ERROR(ExchangeTiedEmbedding(plan));
  // One world-wide sum gives the global gradient norm (each parameter
  // counted once: data-parallel group 0 only, each stage's norm group) and
  // the global loss (every group's last stage).
  double sums[2] = {0, 0};
  ASSIGN_OR_RETURN(sums[0], GradSumOfSquares());
  for (auto& c : chunks_) {
    ASSIGN_OR_RETURN(const double loss, c->TakeLoss());  // 0 on other stages than the last
    sums[1] += loss;
  }
  if (comm_->size() > 1) {
    std::vector<int> world(comm_->size());
    std::iota(world.begin(), world.end(), 0);
    // Through the backend's memory: NCCL reduces device buffers only.
    ASSIGN_OR_RETURN(Buffer scratch, backend_->pool().Get(sizeof(sums), backend_->stream()));
    RETURN_IF_ERROR(backend_->CopyFromHost(scratch.data(), sums, sizeof(sums)));
    RETURN_IF_ERROR(comm_->AllReduceSum(world, scratch.as<double>(), 2, Deadline()));
    RETURN_IF_ERROR(backend_->CopyToHost(sums, scratch.data(), sizeof(sums)));
  }
  const double norm = std::sqrt(sums[0]);
  it->result.loss = sums[1];
  it->result.grad_norm = norm;
  if (!std::isfinite(norm) || !std::isfinite(sums[1])) {
    return absl::InternalError(absl::StrCat("non-finite loss ", sums[1], " or gradient norm ", norm));
  }
  model::OptimizerStepArgs args;
  args.adamw = optim::FromSpec(spec_.optimizer());
  args.lr = optim::LearningRate(spec_.optimizer(), step_);
  args.step = ++step_;
  args.grad_scale = optim::ClipFactor(spec_.optimizer().grad_clip(), norm);
  it->result.lr = args.lr;
  for (auto& c : chunks_) {
    RETURN_IF_ERROR(c->OptimizerStep(args));
    RETURN_IF_ERROR(c->ZeroGrads());
  }
  return sharded() ? GatherParams() : absl::OkStatus();
}

absl::StatusOr<double> Worker::GradSumOfSquares() {
  double total = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    // Regions in layout order, each member's shard in member order: offset order.
    std::vector<model::ParamRun> pieces, mine;
    std::vector<bool> summed_here;
    for (const GradBucket& region : regions_[c]) {
      for (int k = 0; k < dp_; ++k) {
        pieces.push_back(ShardOf(region, dp_, k));
        summed_here.push_back(sharded() ? k == dp_rank_ : dp_rank_ == 0);
        if (summed_here.back()) mine.push_back(pieces.back());
      }
    }
    std::vector<double> sums(mine.size());
    RETURN_IF_ERROR(chunks_[c]->GradSumsOfSquares(mine, sums));
    std::vector<double> by_piece(pieces.size(), 0.0);
    for (size_t i = 0, j = 0; i < pieces.size(); ++i) {
      if (summed_here[i]) by_piece[i] = sums[j++];
    }
    if (sharded()) {
      // Each piece is non-zero on its owner only: the sum is exact, whatever its order.
      ASSIGN_OR_RETURN(Buffer scratch, backend_->pool().Get(by_piece.size() * sizeof(double), backend_->stream()));
      RETURN_IF_ERROR(backend_->CopyFromHost(scratch.data(), by_piece.data(), by_piece.size() * sizeof(double)));
      RETURN_IF_ERROR(comm_->AllReduceSum(dp_group_, scratch.as<double>(), by_piece.size(), Deadline()));
      RETURN_IF_ERROR(backend_->CopyToHost(by_piece.data(), scratch.data(), by_piece.size() * sizeof(double)));
    }
    if (dp_rank_ != 0) continue;
    double chunk = 0;
    for (double s : by_piece) chunk += s;
    total += chunk;
  }
  return total;
}

absl::Status Worker::GatherParams() {
  std::vector<std::unique_ptr<comm::Request>> pending;
  for (size_t c = chunks_.size(); c-- > 0;) {  // the reducer's canonical order
    for (const GradBucket& b : buckets_[c]) {
      ASSIGN_OR_RETURN(auto request, comm_->StartAllGather(dp_group_, chunks_[c]->params() + b.offset,
                                                           ShardCounts(b, regions_[c], dp_), Deadline()));
      pending.push_back(std::move(request));
    }
  }
  for (auto& request : pending) RETURN_IF_ERROR(request->Wait(Deadline()));
  for (auto& c : chunks_) RETURN_IF_ERROR(c->ParamsGathered());
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::executor
