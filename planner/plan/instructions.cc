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

}  // namespace

std::vector<proto::ExecutionPlan> BuildGroupPlans(const GroupPlanInput& in) {
  const PipelineModel& pm = *in.model;
  const int D = pm.num_devices(), C = pm.num_chunks();
  const auto& chunks = pm.chunks();
  const proto::DType::Value dtype = pm.activation_bytes() == 4 ? proto::DType::fp32 : proto::DType::bf16;
  auto dev = [&](int c) { return chunks[c].device; };
  auto rank = [&](int d) { return in.dp_rank * D + d; };
  std::vector<int> local(C, 0), per_device(D, 0);  // chunk index on its device
  for (int c = 0; c < C; ++c) local[c] = per_device[dev(c)]++;

  std::vector<std::vector<Event>> events(D);
  for (auto& e : events) e.reserve(in.mbs.size() * 12);
  std::vector<absl::flat_hash_map<int64_t, int>> logical(D);  // buffer key -> logical id
  auto buf = [&](int d, BufKind k, int mb, int c) {
    auto [it, inserted] = logical[d].emplace(BufKey(k, mb, c), static_cast<int>(logical[d].size()));
    return it->second;
  };
  int64_t seq = 0;
  auto push = [&](int d, Event e) {
    if (e.seq < 0) e.seq = seq++;
    events[d].push_back(e);
  };
  auto release = [&](int d, double t, int id) {
    push(d, Event{.t = t, .seq = -1, .prio = kFree, .op = Op::kFree, .in = id, .start = t, .end = t});
  };

  // Transfers: send start and receive start at the same instant on both
  // sides, ordered by one shared sequence number.
  const int64_t transfer_seq_base = int64_t{1} << 40;
  for (size_t xi = 0; xi < in.sim->transfers.size(); ++xi) {
    const Transfer& x = in.sim->transfers[xi];
    const SimOp& p = x.producer;
    const bool act = p.kind == SimOp::kForward;
    const int recv_chunk = act ? p.chunk + 1 : p.chunk - 1;
    const int boundary = act ? p.chunk : p.chunk - 1;
    const int sbuf = buf(x.src, act ? BufKind::kAct : BufKind::kGrad, p.mb, p.chunk);
    const int rbuf = buf(x.dst, act ? BufKind::kRecvAct : BufKind::kRecvGrad, p.mb, p.chunk);
    const int64_t order = transfer_seq_base + static_cast<int64_t>(xi);
    push(x.src, Event{x.start_ms, order, kSendStart, Op::kSendStart, act, p.mb, p.chunk, rank(x.dst), sbuf, -1,
                      boundary, x.start_ms, x.end_ms});
    push(x.dst, Event{x.start_ms, order, kRecvStart, Op::kRecvStart, act, p.mb, recv_chunk, rank(x.src), -1, rbuf,
                      boundary, x.start_ms, x.end_ms});
    push(x.src, Event{x.end_ms, -1, kSendFinish, Op::kSendFinish, act, p.mb, p.chunk, rank(x.dst), sbuf, -1,
                      boundary, x.start_ms, x.end_ms});
    release(x.src, x.end_ms, sbuf);
  }

  for (int d = 0; d < D; ++d) {
    for (const OpTiming& o : in.sim->ops[d]) {
      const int m = o.op.mb, c = o.op.chunk;
      if (o.op.kind == SimOp::kForward) {
        int input;
        if (c == 0) {
          input = buf(d, BufKind::kInput, m, 0);
          push(d, Event{o.start_ms, -1, kRecvFinishOrLoad, Op::kLoad, false, m, c, -1, -1, input, -1, o.start_ms,
                        o.start_ms});
        } else if (dev(c - 1) != d) {
          input = buf(d, BufKind::kRecvAct, m, c - 1);
          push(d, Event{o.start_ms, -1, kRecvFinishOrLoad, Op::kRecvFinish, true, m, c, rank(dev(c - 1)), input, -1,
                        c - 1, o.start_ms, o.start_ms});
        } else {
          input = buf(d, BufKind::kAct, m, c - 1);  // handed over on this device
        }
        const int out = c < C - 1 ? buf(d, BufKind::kAct, m, c) : -1;
        push(d, Event{o.start_ms, -1, kCompute, Op::kForward, false, m, c, -1, input, out, -1, o.start_ms, o.end_ms});
        release(d, o.end_ms, input);
      } else {
        int grad_in = -1;
        if (c < C - 1) {
          if (dev(c + 1) != d) {
            grad_in = buf(d, BufKind::kRecvGrad, m, c + 1);
            push(d, Event{o.start_ms, -1, kRecvFinishOrLoad, Op::kRecvFinish, false, m, c, rank(dev(c + 1)), grad_in,
                          -1, c, o.start_ms, o.start_ms});
          } else {
            grad_in = buf(d, BufKind::kGrad, m, c + 1);
          }
        }
        const int out = c > 0 ? buf(d, BufKind::kGrad, m, c) : -1;
        push(d, Event{o.start_ms, -1, kCompute, Op::kBackward, false, m, c, -1, grad_in, out, -1, o.start_ms, o.end_ms});
        if (grad_in >= 0) release(d, o.end_ms, grad_in);
      }
    }
  }

  // The group's micro-batches, shared by every rank's plan.
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
  // Tensors crossing boundary c of micro-batch m: the hidden states, plus the
  // encoder output once an encoder-decoder model is in its decoder.
  auto add_shapes = [&](proto::CommOp* op, int m, int boundary) {
    const Shape& s = in.mbs[m].shape;
    auto add = [&](int64_t len) {
      proto::TensorShape* t = op->add_shapes();
      t->add_dims(s.mbs);
      t->add_dims(len);
      t->add_dims(pm.hidden());
      t->set_dtype(dtype);
    };
    add(s.seq);
    if (pm.BoundaryMb(s, boundary) > pm.BoundaryMb(Shape{s.mbs, s.seq, 0}, 0) * 1.0000001 && s.dec_seq > 0) {
      add(s.dec_seq);
    }
  };

  const double end = in.sim->makespan_ms;
  std::vector<proto::ExecutionPlan> plans(D);
  for (int d = 0; d < D; ++d) {
    if (in.dp_size > 1) push(d, Event{end, -1, kEnd, Op::kAllReduce, false, -1, 0, -1, -1, -1, -1, end, end});
    push(d, Event{end, -1, kEnd + 1, Op::kStep, false, -1, 0, -1, -1, -1, -1, end, end});
    std::vector<Event>& ev = events[d];
    std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
      if (a.t != b.t) return a.t < b.t;
      if (a.prio != b.prio) return a.prio < b.prio;
      return a.seq < b.seq;
    });

    proto::ExecutionPlan& plan = plans[d];
    plan.set_schema_version(plan::kPlanSchemaVersion);
    plan.set_job_id(in.job_id);
    plan.set_iteration(in.iteration);
    plan.set_rank(rank(d));
    plan.set_pp_rank(d);
    plan.set_dp_rank(in.dp_rank);
    plan.set_pp_size(D);
    plan.set_dp_size(in.dp_size);
    for (const Chunk& ch : chunks) {
      if (ch.device != d) continue;
      for (int l = 0; l < ch.num_encoder + ch.num_decoder; ++l) plan.add_layers(ch.first_layer + l);
    }
    *plan.mutable_micro_batches() = shared.micro_batches();

    // Interval colouring: a logical buffer takes the lowest free slot when
    // first written and returns it when freed.
    std::vector<int> slot(logical[d].size(), -1);
    std::priority_queue<int, std::vector<int>, std::greater<int>> free_slots;
    int num_slots = 0;
    auto slot_of = [&](int id) { return slot[id]; };
    auto allocate = [&](int id) {
      if (free_slots.empty()) {
        slot[id] = num_slots++;
      } else {
        slot[id] = free_slots.top();
        free_slots.pop();
      }
      return slot[id];
    };
    const auto recompute = static_cast<proto::RecomputeLevel::Value>(static_cast<int>(in.recompute) + 1);
    plan.mutable_instructions()->Reserve(static_cast<int>(ev.size()));
    for (const Event& e : ev) {
      proto::Instruction* ins = plan.add_instructions();
      ins->set_micro_batch(e.mb);
      ins->set_chunk(local[e.chunk]);
      ins->set_sim_start_ms(e.start);
      ins->set_sim_end_ms(e.end);
      switch (e.op) {
        case Op::kLoad: ins->mutable_load_input()->add_buffer_ids(allocate(e.out)); break;
        case Op::kForward: {
          proto::Forward* f = ins->mutable_forward();
          f->set_recompute(recompute);
          f->add_input_buffers(slot_of(e.in));
          if (e.out >= 0) f->add_output_buffers(allocate(e.out));
          break;
        }
        case Op::kBackward: {
          proto::Backward* b = ins->mutable_backward();
          b->set_first_bw_layer(chunks[e.chunk].first_layer);
          if (e.in >= 0) b->add_grad_input_buffers(slot_of(e.in));
          if (e.out >= 0) b->add_grad_output_buffers(allocate(e.out));
          break;
        }
        case Op::kSendStart:
        case Op::kSendFinish:
        case Op::kRecvStart:
        case Op::kRecvFinish: {
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
          c->add_buffer_ids(e.op == Op::kRecvStart ? allocate(e.out) : slot_of(e.in));
          add_shapes(c, e.mb, e.boundary);
          break;
        }
        case Op::kFree:
          ins->mutable_free_buffer()->add_buffer_ids(slot_of(e.in));
          free_slots.push(slot_of(e.in));
          break;
        case Op::kAllReduce:
          for (int g = 0; g < in.dp_size; ++g) ins->mutable_all_reduce_grads()->add_dp_peers(g * D + d);
          break;
        case Op::kStep: ins->mutable_optimizer_step(); break;
      }
    }
    plan.set_num_buffer_slots(num_slots);
    plan.set_recompute(recompute);
    plan.set_schedule(in.schedule == ScheduleKind::kOneFOneB         ? proto::ScheduleSpec::one_f_one_b
                      : in.schedule == ScheduleKind::kInterleaved1F1B ? proto::ScheduleSpec::interleaved_1f1b
                                                                      : proto::ScheduleSpec::wait_free_cyclic);
    plan.set_predicted_iteration_ms(in.predicted_iteration_ms);
    plan.set_global_loss_tokens(in.global_loss_tokens);
    plan.set_predicted_peak_memory_mb(in.sim->peak_mb[d]);
    plan::SealPlan(&plan);
  }
  return plans;
}

}  // namespace dynapipe::planner
