#include "planner/plan/instructions.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "src/plan/plan_seal.h"

namespace dynapipe::planner {
namespace {

// Order of instructions that share a simulated instant on one device.
// Executors run a plan in order, so a send that starts when a compute does
// goes first: after the compute it would wait for it and leave the peer one
// compute late. Starts never block; a send's data is ready by its start (its
// producer ended before), so it may also go before the waits for inputs.
enum Prio : int8_t {
  kRecvStart = 0,
  kSendStart = 1,
  kRecvFinishOrLoad = 2,
  kCompute = 3,
  kSendFinish = 4,
  kFree = 5,
  kEnd = 6,
};

enum class BufKind : uint8_t { kInput, kAct, kRecvAct, kGrad, kRecvGrad };

enum class Op : uint8_t { kLoad, kForward, kBackward, kSendStart, kSendFinish, kRecvStart, kRecvFinish, kFree, kAllReduce, kStep };

// A plan instruction before it becomes a proto: small, cheap to sort.
struct Event {
  double t;
  int64_t seq;
  int8_t prio;
  Op op;
  bool act = false;      // transfers: activation (true) or gradient
  int mb = -1;
  int chunk = 0;         // global chunk the instruction belongs to
  int peer = -1;         // transfers: peer rank
  int in = -1, out = -1; // logical buffers read / written (kFree: released)
  int boundary = -1;     // transfers: chunk boundary (c -> c+1) whose tensors move
  double start = 0, end = 0;
};

int64_t BufKey(BufKind k, int mb, int chunk) {
  return (static_cast<int64_t>(k) << 48) | (static_cast<int64_t>(mb) << 20) | chunk;
}

// Every device's events of one group, added phase by phase. Logical buffer ids
// and sequence numbers follow the order of the calls, so the phases run in a
// fixed order: transfers, computes, then each device's iteration end.
struct GroupEvents {
  explicit GroupEvents(const GroupPlanInput& input)
      : in(input), pm(*input.model), D(pm.num_devices()), C(pm.num_chunks()), events(D), logical(D) {
    std::vector<int> per_device(D, 0);
    local.assign(C, 0);
    for (int c = 0; c < C; ++c) local[c] = per_device[Dev(c)]++;
    for (auto& e : events) e.reserve(in.mbs.size() * 12);
  }

  int Dev(int c) const { return pm.chunks()[c].device; }
  int Rank(int d) const { return in.dp_rank * D + d; }
  int Buf(int d, BufKind k, int mb, int c) {
    auto [it, inserted] = logical[d].emplace(BufKey(k, mb, c), static_cast<int>(logical[d].size()));
    return it->second;
  }
  void Push(int d, Event e) {
    if (e.seq < 0) e.seq = seq++;
    events[d].push_back(e);
  }
  void Release(int d, double t, int id) {
    Push(d, Event{.t = t, .seq = -1, .prio = kFree, .op = Op::kFree, .in = id, .start = t, .end = t});
  }

  void AddTransfers();
  void AddForward(int d, const OpTiming& o);
  void AddBackward(int d, const OpTiming& o);
  void AddComputes() {
    for (int d = 0; d < D; ++d) {
      for (const OpTiming& o : in.sim->ops[d]) {
        if (o.op.kind == SimOp::kForward) {
          AddForward(d, o);
        } else {
          AddBackward(d, o);
        }
      }
    }
  }
  // The all-reduce (data parallel only) and the optimizer step at the makespan.
  void AddIterationEnd(int d) {
    const double end = in.sim->makespan_ms;
    if (in.dp_size > 1) Push(d, Event{end, -1, kEnd, Op::kAllReduce, false, -1, 0, -1, -1, -1, -1, end, end});
    Push(d, Event{end, -1, kEnd + 1, Op::kStep, false, -1, 0, -1, -1, -1, -1, end, end});
  }
  // Device d's events in plan order: by instant, then priority, then sequence.
  const std::vector<Event>& Sorted(int d) {
    std::vector<Event>& ev = events[d];
    std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
      if (a.t != b.t) return a.t < b.t;
      if (a.prio != b.prio) return a.prio < b.prio;
      return a.seq < b.seq;
    });
    return ev;
  }

  const GroupPlanInput& in;
  const PipelineModel& pm;
  const int D, C;
  std::vector<int> local;  // chunk index on its device
  std::vector<std::vector<Event>> events;
  std::vector<absl::flat_hash_map<int64_t, int>> logical;  // buffer key -> logical id
  int64_t seq = 0;
};

// Transfers: send start and receive start at the same instant on both sides,
// ordered by one shared sequence number.
void GroupEvents::AddTransfers() {
  const int64_t transfer_seq_base = int64_t{1} << 40;
  for (size_t xi = 0; xi < in.sim->transfers.size(); ++xi) {
    const Transfer& x = in.sim->transfers[xi];
    const SimOp& p = x.producer;
    const bool act = p.kind == SimOp::kForward;
    const int recv_chunk = act ? p.chunk + 1 : p.chunk - 1;
    const int boundary = act ? p.chunk : p.chunk - 1;
    const int sbuf = Buf(x.src, act ? BufKind::kAct : BufKind::kGrad, p.mb, p.chunk);
    const int rbuf = Buf(x.dst, act ? BufKind::kRecvAct : BufKind::kRecvGrad, p.mb, p.chunk);
    const int64_t order = transfer_seq_base + static_cast<int64_t>(xi);
    Push(x.src, Event{x.start_ms, order, kSendStart, Op::kSendStart, act, p.mb, p.chunk, Rank(x.dst), sbuf, -1,
                      boundary, x.start_ms, x.end_ms});
    Push(x.dst, Event{x.start_ms, order, kRecvStart, Op::kRecvStart, act, p.mb, recv_chunk, Rank(x.src), -1, rbuf,
                      boundary, x.start_ms, x.end_ms});
    Push(x.src, Event{x.end_ms, -1, kSendFinish, Op::kSendFinish, act, p.mb, p.chunk, Rank(x.dst), sbuf, -1,
                      boundary, x.start_ms, x.end_ms});
    Release(x.src, x.end_ms, sbuf);
  }
}

// A forward takes its input from the loader, a receive, or the previous chunk
// on the same device, and frees it when done.
void GroupEvents::AddForward(int d, const OpTiming& o) {
  const int m = o.op.mb, c = o.op.chunk;
  int input;
  if (c == 0) {
    input = Buf(d, BufKind::kInput, m, 0);
    Push(d, Event{o.start_ms, -1, kRecvFinishOrLoad, Op::kLoad, false, m, c, -1, -1, input, -1, o.start_ms,
                  o.start_ms});
  } else if (Dev(c - 1) != d) {
    input = Buf(d, BufKind::kRecvAct, m, c - 1);
    Push(d, Event{o.start_ms, -1, kRecvFinishOrLoad, Op::kRecvFinish, true, m, c, Rank(Dev(c - 1)), input, -1,
                  c - 1, o.start_ms, o.start_ms});
  } else {
    input = Buf(d, BufKind::kAct, m, c - 1);  // handed over on this device
  }
  const int out = c < C - 1 ? Buf(d, BufKind::kAct, m, c) : -1;
  Push(d, Event{o.start_ms, -1, kCompute, Op::kForward, false, m, c, -1, input, out, -1, o.start_ms, o.end_ms});
  Release(d, o.end_ms, input);
}

// A backward takes its gradient from a receive or the next chunk on the same
// device (none for the last chunk).
void GroupEvents::AddBackward(int d, const OpTiming& o) {
  const int m = o.op.mb, c = o.op.chunk;
  int grad_in = -1;
  if (c < C - 1) {
    if (Dev(c + 1) != d) {
      grad_in = Buf(d, BufKind::kRecvGrad, m, c + 1);
      Push(d, Event{o.start_ms, -1, kRecvFinishOrLoad, Op::kRecvFinish, false, m, c, Rank(Dev(c + 1)), grad_in,
                    -1, c, o.start_ms, o.start_ms});
    } else {
      grad_in = Buf(d, BufKind::kGrad, m, c + 1);
    }
  }
  const int out = c > 0 ? Buf(d, BufKind::kGrad, m, c) : -1;
  Push(d, Event{o.start_ms, -1, kCompute, Op::kBackward, false, m, c, -1, grad_in, out, -1, o.start_ms, o.end_ms});
  if (grad_in >= 0) Release(d, o.end_ms, grad_in);
}

// The group's micro-batches, shared by every rank's plan.
proto::ExecutionPlan SharedMicroBatches(const GroupPlanInput& in) {
  proto::ExecutionPlan shared;
  for (size_t m = 0; m < in.mbs.size(); ++m) {
    const MicroBatch& mb = in.mbs[m];
    proto::MicroBatch* pmb = shared.add_micro_batches();
    pmb->set_index(static_cast<int>(m));
    pmb->set_rows(mb.shape.mbs);
    pmb->set_seq_len(mb.shape.seq);
    pmb->set_dec_seq_len(mb.shape.dec_seq);
    pmb->mutable_samples()->Reserve(static_cast<int>(mb.samples.size()));
    for (const Placement& p : mb.samples) {
      const Sample& s = in.samples[p.sample];
      proto::PlacedSample* ps = pmb->add_samples();
      ps->set_id(s.id);
      ps->set_input_len(s.input);
      ps->set_target_len(s.target);
      ps->set_row(p.row);
      ps->set_offset(p.offset);
    }
  }
  return shared;
}

// Interval colouring: a logical buffer takes the lowest free slot when first
// written and returns it when freed.
class SlotColouring {
 public:
  explicit SlotColouring(size_t num_logical) : slot_(num_logical, -1) {}
  int Of(int id) const { return slot_[id]; }
  int Allocate(int id) {
    if (free_slots_.empty()) {
      slot_[id] = num_slots_++;
    } else {
      slot_[id] = free_slots_.top();
      free_slots_.pop();
    }
    return slot_[id];
  }
  void Free(int slot) { free_slots_.push(slot); }
  int num_slots() const { return num_slots_; }

 private:
  std::vector<int> slot_;
  std::priority_queue<int, std::vector<int>, std::greater<int>> free_slots_;
  int num_slots_ = 0;
};

// Turns one device's sorted events into instructions of its plan.
class InstructionWriter {
 public:
  InstructionWriter(const GroupEvents& g, int d, size_t num_logical)
      : g_(g), d_(d), slots_(num_logical),
        dtype_(g.pm.activation_bytes() == 4 ? proto::DType::fp32 : proto::DType::bf16),
        recompute_(static_cast<proto::RecomputeLevel::Value>(static_cast<int>(g.in.recompute) + 1)) {}

  void Write(const Event& e, proto::Instruction* ins);
  int num_slots() const { return slots_.num_slots(); }
  proto::RecomputeLevel::Value recompute() const { return recompute_; }

 private:
  void WriteComm(const Event& e, proto::Instruction* ins);
  void AddShapes(proto::CommOp* op, int m, int boundary) const;

  const GroupEvents& g_;
  const int d_;
  SlotColouring slots_;
  const proto::DType::Value dtype_;
  const proto::RecomputeLevel::Value recompute_;
};

void InstructionWriter::Write(const Event& e, proto::Instruction* ins) {
  ins->set_micro_batch(e.mb);
  ins->set_chunk(g_.local[e.chunk]);
  ins->set_sim_start_ms(e.start);
  ins->set_sim_end_ms(e.end);
  switch (e.op) {
    case Op::kLoad: ins->mutable_load_input()->add_buffer_ids(slots_.Allocate(e.out)); break;
    case Op::kForward: {
      proto::Forward* f = ins->mutable_forward();
      f->set_recompute(recompute_);
      f->add_input_buffers(slots_.Of(e.in));
      if (e.out >= 0) f->add_output_buffers(slots_.Allocate(e.out));
      break;
    }
    case Op::kBackward: {
      proto::Backward* b = ins->mutable_backward();
      b->set_first_bw_layer(g_.pm.chunks()[e.chunk].first_layer);
      if (e.in >= 0) b->add_grad_input_buffers(slots_.Of(e.in));
      if (e.out >= 0) b->add_grad_output_buffers(slots_.Allocate(e.out));
      break;
    }
    case Op::kSendStart:
    case Op::kSendFinish:
    case Op::kRecvStart:
    case Op::kRecvFinish: WriteComm(e, ins); break;
    case Op::kFree:
      ins->mutable_free_buffer()->add_buffer_ids(slots_.Of(e.in));
      slots_.Free(slots_.Of(e.in));
      break;
    case Op::kAllReduce:
      for (int g = 0; g < g_.in.dp_size; ++g) ins->mutable_all_reduce_grads()->add_dp_peers(g * g_.D + d_);
      break;
    case Op::kStep: ins->mutable_optimizer_step(); break;
  }
}

void InstructionWriter::WriteComm(const Event& e, proto::Instruction* ins) {
  proto::CommOp* c;
  if (e.op == Op::kSendStart) {
    c = e.act ? ins->mutable_send_activation_start() : ins->mutable_send_grad_start();
  } else if (e.op == Op::kSendFinish) {
    c = e.act ? ins->mutable_send_activation_finish() : ins->mutable_send_grad_finish();
  } else if (e.op == Op::kRecvStart) {
    c = e.act ? ins->mutable_recv_activation_start() : ins->mutable_recv_grad_start();
  } else {
    c = e.act ? ins->mutable_recv_activation_finish() : ins->mutable_recv_grad_finish();
  }
  c->set_peer(e.peer);
  c->add_buffer_ids(e.op == Op::kRecvStart ? slots_.Allocate(e.out) : slots_.Of(e.in));
  AddShapes(c, e.mb, e.boundary);
}

// Tensors crossing boundary c of micro-batch m: the hidden states, plus the
// encoder output once an encoder-decoder model is in its decoder.
void InstructionWriter::AddShapes(proto::CommOp* op, int m, int boundary) const {
  const PipelineModel& pm = g_.pm;
  const Shape& s = g_.in.mbs[m].shape;
  auto add = [&](int64_t len) {
    proto::TensorShape* t = op->add_shapes();
    t->add_dims(s.mbs);
    t->add_dims(len);
    t->add_dims(pm.hidden());
    t->set_dtype(dtype_);
  };
  add(s.seq);
  if (pm.BoundaryMb(s, boundary) > pm.BoundaryMb(Shape{s.mbs, s.seq, 0}, 0) * 1.0000001 && s.dec_seq > 0) {
    add(s.dec_seq);
  }
}

// Identity of device d's plan: job, iteration, ranks and its layers.
void SetPlanHeader(const GroupEvents& g, int d, proto::ExecutionPlan& plan) {
  plan.set_schema_version(plan::kPlanSchemaVersion);
  plan.set_job_id(g.in.job_id);
  plan.set_iteration(g.in.iteration);
  plan.set_rank(g.Rank(d));
  plan.set_pp_rank(d);
  plan.set_dp_rank(g.in.dp_rank);
  plan.set_pp_size(g.D);
  plan.set_dp_size(g.in.dp_size);
  for (const Chunk& ch : g.pm.chunks()) {
    if (ch.device != d) continue;
    for (int l = 0; l < ch.num_encoder + ch.num_decoder; ++l) plan.add_layers(ch.first_layer + l);
  }
}

// What the plan was chosen with and predicted to cost; then the seal.
void SetPlanSummaryAndSeal(const GroupPlanInput& in, int d, const InstructionWriter& w, proto::ExecutionPlan& plan) {
  plan.set_num_buffer_slots(w.num_slots());
  plan.set_recompute(w.recompute());
  plan.set_schedule(in.schedule == ScheduleKind::kOneFOneB         ? proto::ScheduleSpec::one_f_one_b
                    : in.schedule == ScheduleKind::kInterleaved1F1B ? proto::ScheduleSpec::interleaved_1f1b
                                                                    : proto::ScheduleSpec::wait_free_cyclic);
  plan.set_predicted_iteration_ms(in.predicted_iteration_ms);
  plan.set_global_loss_tokens(in.global_loss_tokens);
  plan.set_predicted_peak_memory_mb(in.sim->peak_mb[d]);
  plan::SealPlan(&plan);
}

}  // namespace

std::vector<proto::ExecutionPlan> BuildGroupPlans(const GroupPlanInput& in) {
  GroupEvents g(in);
  g.AddTransfers();
  g.AddComputes();
  const proto::ExecutionPlan shared = SharedMicroBatches(in);

  std::vector<proto::ExecutionPlan> plans(g.D);
  for (int d = 0; d < g.D; ++d) {
    g.AddIterationEnd(d);
    const std::vector<Event>& ev = g.Sorted(d);
    proto::ExecutionPlan& plan = plans[d];
    SetPlanHeader(g, d, plan);
    *plan.mutable_micro_batches() = shared.micro_batches();
    InstructionWriter writer(g, d, g.logical[d].size());
    plan.mutable_instructions()->Reserve(static_cast<int>(ev.size()));
    for (const Event& e : ev) writer.Write(e, plan.add_instructions());
    SetPlanSummaryAndSeal(in, d, writer, plan);
  }
  return plans;
}

}  // namespace dynapipe::planner
