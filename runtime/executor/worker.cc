#include "runtime/executor/worker.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
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
enum TagKind : uint64_t { kPipeline = 0, kTied = 1 };
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

int64_t Elements(const proto::CommOp& op) {
  int64_t total = 0;
  for (const proto::TensorShape& s : op.shapes()) {
    int64_t n = 1;
    for (int64_t d : s.dims()) n *= d;
    total += n;
  }
  return total;
}

}  // namespace

struct Worker::Iter {
  int64_t iteration = 0;
  Clock::time_point start;
  float loss_scale = 0;
  double loss_sum = 0;
  std::map<int, model::TokenBatch> batches;  // by micro-batch
  std::vector<Buffer> slots;
  std::map<int, std::unique_ptr<comm::Request>> pending;  // by slot
  std::map<int, uint64_t> sent, received;                  // transfers per peer
  IterationResult result;
};

Worker::Worker(const proto::JobSpec& spec, int rank, int pp, int dp, comm::Communicator* comm,
               const data::Dataset* ds, WorkerOptions o)
    : spec_(spec), rank_(rank), pp_(pp), dp_(dp), comm_(comm), dataset_(ds), options_(o), pool_(CpuAllocator()) {}

Worker::~Worker() {
  chunks_.clear();  // stashed activations go back to the pool before it goes
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const proto::JobSpec& spec, std::span<const int32_t> layers,
                                                       int rank, int pp_size, int dp_size, comm::Communicator* comm,
                                                       const data::Dataset* dataset, WorkerOptions options) {
  ASSIGN_OR_RETURN(const model::GptConfig config, model::GptConfig::FromSpec(spec.model()));
  if (layers.empty()) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": plan assigns no layers"));
  if (comm == nullptr || comm->size() != pp_size * dp_size || comm->rank() != rank) {
    return absl::InvalidArgumentError("communicator does not match the job's ranks");
  }
  std::unique_ptr<Worker> w(new Worker(spec, rank, pp_size, dp_size, comm, dataset, options));
  // Chunks: maximal runs of consecutive layers.
  size_t i = 0;
  while (i < layers.size()) {
    size_t j = i + 1;
    while (j < layers.size() && layers[j] == layers[j - 1] + 1) ++j;
    model::GptStage::Options o;
    o.first_layer = layers[i];
    o.num_layers = static_cast<int>(j - i);
    o.first = o.first_layer == 0;
    o.last = o.first_layer + o.num_layers == config.num_layers;
    o.seed = spec.seed();
    ASSIGN_OR_RETURN(auto stage, model::GptStage::Create(config, o, &w->pool_));
    w->m_.emplace_back(stage->param_data().size(), 0.0f);
    w->v_.emplace_back(stage->param_data().size(), 0.0f);
    w->chunks_.push_back(std::move(stage));
    i = j;
  }
  return w;
}

absl::StatusOr<IterationResult> Worker::RunIteration(const proto::ExecutionPlan& plan) {
  if (plan.rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("plan for rank ", plan.rank(), " given to rank ", rank_));
  }
  if (plan.global_loss_tokens() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("iteration ", plan.iteration(), ": plan has no loss tokens"));
  }
  Iter it;
  it.iteration = plan.iteration();
  it.start = Clock::now();
  it.loss_scale = 1.0f / static_cast<float>(plan.global_loss_tokens());
  it.slots.resize(static_cast<size_t>(std::max(0, plan.num_buffer_slots())));
  pool_.ResetPeak();
  it.result.timings.reserve(plan.instructions_size());
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const auto t0 = Clock::now();
    const absl::Status s = Execute(plan, i, &it);
    if (!s.ok()) {
      // Peers blocked on us must fail fast rather than wait out their deadline.
      comm_->Abort();
      return Annotate(s, absl::StrCat("rank ", rank_, " iteration ", plan.iteration(), " instruction ", i, " (",
                                      OpName(plan.instructions(i)), ")"));
    }
    proto::InstructionTiming t;
    t.set_index(i);
    t.set_start_ms(MsBetween(it.start, t0));
    t.set_end_ms(MsBetween(it.start, Clock::now()));
    it.result.timings.push_back(t);
  }
  for (auto& [slot, req] : it.pending) {
    return absl::InternalError(absl::StrCat("iteration ", plan.iteration(), ": transfer on slot ", slot,
                                            " never finished (plan bug)"));
  }
  for (const auto& c : chunks_) {
    if (c->in_flight() != 0) {
      return absl::InternalError(absl::StrCat("iteration ", plan.iteration(), ": micro-batches forwarded but never "
                                              "backwarded (plan bug)"));
    }
  }
  for (const auto& [mb, batch] : it.batches) it.result.tokens += batch.real_tokens;
  it.slots.clear();
  size_t state_bytes = 0;
  for (const auto& c : chunks_) state_bytes += c->param_data().size() * 4 * sizeof(float);  // params, grads, m, v
  const PoolStats pool = pool_.stats();
  it.result.peak_memory_mb = static_cast<double>(pool.peak_in_use_bytes + state_bytes) / (1 << 20);
  it.result.peak_reserved_mb = static_cast<double>(pool.peak_reserved_bytes + state_bytes) / (1 << 20);
  it.result.memory_fragmentation = pool.Fragmentation();
  it.result.iteration_ms = MsBetween(it.start, Clock::now());
  return std::move(it.result);
}

absl::Status Worker::Execute(const proto::ExecutionPlan& plan, int index, Iter* it) {
  const proto::Instruction& ins = plan.instructions(index);
  auto chunk = [&]() -> absl::StatusOr<model::GptStage*> {
    if (ins.chunk() < 0 || ins.chunk() >= static_cast<int>(chunks_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", ins.chunk(), " is not on this rank"));
    }
    return chunks_[ins.chunk()].get();
  };
  auto batch = [&]() -> absl::StatusOr<const model::TokenBatch*> {
    const int mb = ins.micro_batch();
    if (mb < 0 || mb >= plan.micro_batches_size()) return absl::InvalidArgumentError(absl::StrCat("micro-batch ", mb));
    auto found = it->batches.find(mb);
    if (found == it->batches.end()) {
      ASSIGN_OR_RETURN(model::TokenBatch b,
                       model::BuildTokenBatch(plan.micro_batches(mb), *dataset_, spec_.model().max_positions()));
      found = it->batches.emplace(mb, std::move(b)).first;
    }
    return &found->second;
  };
  auto slot = [&](int id, size_t min_bytes) -> absl::StatusOr<Buffer*> {
    if (id < 0 || id >= static_cast<int>(it->slots.size())) return absl::InvalidArgumentError(absl::StrCat("slot ", id));
    Buffer* b = &it->slots[id];
    if (b->bytes() < min_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", id, " holds ", b->bytes(), " bytes, needs ", min_bytes));
    }
    return b;
  };
  auto fresh = [&](int id, size_t bytes) -> absl::StatusOr<Buffer*> {
    if (id < 0 || id >= static_cast<int>(it->slots.size())) return absl::InvalidArgumentError(absl::StrCat("slot ", id));
    if (!it->slots[id].empty() || it->pending.contains(id)) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", id, " is still in use"));
    }
    it->slots[id] = pool_.Get(bytes);
    return &it->slots[id];
  };
  auto wait = [&](int id) -> absl::Status {
    auto p = it->pending.find(id);
    if (p == it->pending.end()) return absl::InvalidArgumentError(absl::StrCat("no transfer pending on slot ", id));
    std::unique_ptr<comm::Request> req = std::move(p->second);
    it->pending.erase(p);
    return req->Wait(Deadline());
  };
  auto start = [&](const proto::CommOp& op, bool send) -> absl::Status {
    if (op.buffer_ids_size() != 1) return absl::InvalidArgumentError("transfer: expected one buffer");
    const size_t bytes = static_cast<size_t>(Elements(op)) * sizeof(float);
    const int id = op.buffer_ids(0);
    const int peer = op.peer();
    if (send) {
      ASSIGN_OR_RETURN(Buffer * b, slot(id, bytes));
      const uint64_t tag = Tag(it->iteration, kPipeline, rank_, peer, it->sent[peer]++);
      ASSIGN_OR_RETURN(auto req, comm_->Send(peer, tag, b->data(), bytes));
      it->pending[id] = std::move(req);
    } else {
      ASSIGN_OR_RETURN(Buffer * b, fresh(id, bytes));
      const uint64_t tag = Tag(it->iteration, kPipeline, peer, rank_, it->received[peer]++);
      ASSIGN_OR_RETURN(auto req, comm_->Recv(peer, tag, b->data(), bytes));
      it->pending[id] = std::move(req);
    }
    return absl::OkStatus();
  };

  switch (ins.op_case()) {
    case proto::Instruction::kLoadInput: {
      // Token tensors live beside the slots (every stage reads the dataset
      // itself); the slot only marks the input as loaded.
      RETURN_IF_ERROR(batch().status());
      return absl::OkStatus();
    }
    case proto::Instruction::kForward: {
      ASSIGN_OR_RETURN(model::GptStage * st, chunk());
      ASSIGN_OR_RETURN(const model::TokenBatch* b, batch());
      const size_t hidden_bytes = static_cast<size_t>(st->HiddenElements(*b)) * sizeof(float);
      const float* in = nullptr;
      if (!st->options().first) {
        if (ins.forward().input_buffers_size() != 1) return absl::InvalidArgumentError("forward: expected one input");
        ASSIGN_OR_RETURN(Buffer * src, slot(ins.forward().input_buffers(0), hidden_bytes));
        in = src->as<const float>();
      }
      float* out = nullptr;
      if (!st->options().last) {
        if (ins.forward().output_buffers_size() != 1) return absl::InvalidArgumentError("forward: expected one output");
        ASSIGN_OR_RETURN(Buffer * dst, fresh(ins.forward().output_buffers(0), hidden_bytes));
        out = dst->as<float>();
      }
      ASSIGN_OR_RETURN(const double loss, st->Forward(ins.micro_batch(), *b, in, out, it->loss_scale));
      it->loss_sum += loss;
      return absl::OkStatus();
    }
    case proto::Instruction::kBackward: {
      ASSIGN_OR_RETURN(model::GptStage * st, chunk());
      ASSIGN_OR_RETURN(const model::TokenBatch* b, batch());
      const size_t hidden_bytes = static_cast<size_t>(st->HiddenElements(*b)) * sizeof(float);
      const float* dout = nullptr;
      if (!st->options().last) {
        if (ins.backward().grad_input_buffers_size() != 1) return absl::InvalidArgumentError("backward: no gradient in");
        ASSIGN_OR_RETURN(Buffer * src, slot(ins.backward().grad_input_buffers(0), hidden_bytes));
        dout = src->as<const float>();
      }
      float* din = nullptr;
      if (!st->options().first) {
        if (ins.backward().grad_output_buffers_size() != 1) return absl::InvalidArgumentError("backward: no gradient out");
        ASSIGN_OR_RETURN(Buffer * dst, fresh(ins.backward().grad_output_buffers(0), hidden_bytes));
        din = dst->as<float>();
      }
      return st->Backward(ins.micro_batch(), dout, din);
    }
    case proto::Instruction::kSendActivationStart: return start(ins.send_activation_start(), true);
    case proto::Instruction::kSendGradStart: return start(ins.send_grad_start(), true);
    case proto::Instruction::kRecvActivationStart: return start(ins.recv_activation_start(), false);
    case proto::Instruction::kRecvGradStart: return start(ins.recv_grad_start(), false);
    case proto::Instruction::kSendActivationFinish: return wait(ins.send_activation_finish().buffer_ids(0));
    case proto::Instruction::kSendGradFinish: return wait(ins.send_grad_finish().buffer_ids(0));
    case proto::Instruction::kRecvActivationFinish: return wait(ins.recv_activation_finish().buffer_ids(0));
    case proto::Instruction::kRecvGradFinish: return wait(ins.recv_grad_finish().buffer_ids(0));
    case proto::Instruction::kFreeBuffer: {
      for (int id : ins.free_buffer().buffer_ids()) {
        if (id < 0 || id >= static_cast<int>(it->slots.size())) return absl::InvalidArgumentError(absl::StrCat("slot ", id));
        if (it->pending.contains(id)) RETURN_IF_ERROR(wait(id));  // never free memory a transfer still uses
        it->slots[id].Release();
      }
      return absl::OkStatus();
    }
    case proto::Instruction::kAllReduceGrads: {
      const auto& peers = ins.all_reduce_grads().dp_peers();
      std::vector<int> group(peers.begin(), peers.end());
      if (group.size() <= 1) return absl::OkStatus();
      for (auto& c : chunks_) {
        std::span<float> g = c->grad_data();
        RETURN_IF_ERROR(comm_->AllReduceSum(group, g.data(), g.size(), Deadline()));
      }
      return absl::OkStatus();
    }
    case proto::Instruction::kOptimizerStep: return OptimizerStep(plan, it);
    case proto::Instruction::OP_NOT_SET: break;
  }
  return absl::InvalidArgumentError("instruction without an operation");
}

absl::Status Worker::ExchangeTiedEmbedding(const proto::ExecutionPlan& plan, Iter* it) {
  model::GptStage* first = nullptr;
  model::GptStage* last = nullptr;
  for (auto& c : chunks_) {
    if (!c->HasSharedEmbedding()) continue;
    (c->options().first ? first : last) = c.get();
  }
  auto wte_grad = [](model::GptStage* s) {
    const model::ParamInfo* p = s->FindParam("wte");
    return s->grad_data().subspan(p->offset, p->size);
  };
  if (first != nullptr && last != nullptr) {  // both copies on this device
    std::span<float> a = wte_grad(first), b = wte_grad(last);
    for (size_t i = 0; i < a.size(); ++i) b[i] = a[i] += b[i];
    return absl::OkStatus();
  }
  model::GptStage* mine = first != nullptr ? first : last;
  if (mine == nullptr) return absl::OkStatus();
  // The other copy sits on the group's other end of the pipeline.
  const int peer = plan.dp_rank() * pp_ + (first != nullptr ? pp_ - 1 : 0);
  std::span<float> g = wte_grad(mine);
  std::vector<float> theirs(g.size()), own(g.begin(), g.end());
  const size_t bytes = g.size() * sizeof(float);
  ASSIGN_OR_RETURN(auto send, comm_->Send(peer, Tag(it->iteration, kTied, rank_, peer, 0), own.data(), bytes));
  ASSIGN_OR_RETURN(auto recv, comm_->Recv(peer, Tag(it->iteration, kTied, peer, rank_, 0), theirs.data(), bytes));
  RETURN_IF_ERROR(recv->Wait(Deadline()));
  RETURN_IF_ERROR(send->Wait(Deadline()));
  // Same order of addition on both ends (first + last), so the copies stay
  // bit-identical.
  if (first != nullptr) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = own[i] + theirs[i];
  } else {
    for (size_t i = 0; i < g.size(); ++i) g[i] = theirs[i] + own[i];
  }
  return absl::OkStatus();
}

absl::Status Worker::OptimizerStep(const proto::ExecutionPlan& plan, Iter* it) {
  RETURN_IF_ERROR(ExchangeTiedEmbedding(plan, it));
  // One world-wide sum gives the global gradient norm (each parameter
  // counted once: data-parallel group 0 only, the head's wte copy skipped)
  // and the global loss (every group's last stage).
  double sums[2] = {0, 0};
  for (auto& c : chunks_) {
    if (plan.dp_rank() == 0) {
      for (const model::ParamInfo& p : c->params()) {
        if (p.name == "wte" && c->HasSharedEmbedding() && !c->options().first) continue;
        for (float x : c->grad_data().subspan(p.offset, p.size)) sums[0] += static_cast<double>(x) * x;
      }
    }
    if (c->options().last) sums[1] += it->loss_sum;
  }
  if (comm_->size() > 1) {
    std::vector<int> world(comm_->size());
    std::iota(world.begin(), world.end(), 0);
    RETURN_IF_ERROR(comm_->AllReduceSum(world, sums, 2, Deadline()));
  }
  const double norm = std::sqrt(sums[0]);
  it->result.loss = sums[1];
  it->result.grad_norm = norm;
  if (!std::isfinite(norm) || !std::isfinite(sums[1])) {
    return absl::InternalError(absl::StrCat("non-finite loss ", sums[1], " or gradient norm ", norm));
  }
  std::vector<std::span<float>> grads;
  for (auto& c : chunks_) grads.push_back(c->grad_data());
  optim::ClipByGlobalNorm(grads, spec_.optimizer().grad_clip(), norm);
  const optim::AdamWConfig cfg = optim::FromSpec(spec_.optimizer());
  optim::AdamWConfig no_decay = cfg;
  no_decay.weight_decay = 0;  // biases and LayerNorm gains
  const double lr = optim::LearningRate(spec_.optimizer(), step_, spec_.iterations());
  it->result.lr = lr;
  ++step_;
  for (size_t k = 0; k < chunks_.size(); ++k) {
    model::GptStage& c = *chunks_[k];
    for (const model::ParamInfo& p : c.params()) {
      optim::AdamWStep(c.param_data().subspan(p.offset, p.size), c.grad_data().subspan(p.offset, p.size),
                       std::span<float>(m_[k]).subspan(p.offset, p.size),
                       std::span<float>(v_[k]).subspan(p.offset, p.size), p.shape.size() >= 2 ? cfg : no_decay, lr,
                       step_);
    }
    c.ZeroGrads();
  }
  return absl::OkStatus();
}

}  // namespace dynapipe::runtime::executor
