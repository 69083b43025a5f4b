#include "planner/plan/instructions.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "absl/container/flat_hash_map.h"

namespace dynapipe::planner {
namespace {

using proto::Instruction;

// Order of instructions that share a simulated instant on one device.
enum Prio : int {
  kRecvStart = 0,
  kRecvFinishOrLoad = 1,
  kCompute = 2,
  kSendStart = 3,
  kSendFinish = 4,
  kFree = 5,
  kEnd = 6,
};

enum class BufKind : uint8_t { kInput, kAct, kRecvAct, kGrad, kRecvGrad };

struct Event {
  double t;
  int prio;
  int64_t seq;
  Instruction ins;  // buffer fields hold logical ids until slots are assigned
  int writes = -1;  // logical buffer allocated by this instruction
  int frees = -1;   // logical buffer released
};

int64_t BufKey(BufKind k, int mb, int chunk) {
  return (static_cast<int64_t>(k) << 48) | (static_cast<int64_t>(mb) << 20) | chunk;
}

}  // namespace

uint64_t PlanChecksum(const proto::ExecutionPlan& plan) {
  proto::ExecutionPlan copy = plan;
  copy.clear_checksum();
  const std::string bytes = copy.SerializeAsString();
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: stable across processes and builds
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void SealPlan(proto::ExecutionPlan* plan) { plan->set_checksum(PlanChecksum(*plan)); }

std::vector<proto::ExecutionPlan> BuildGroupPlans(const GroupPlanInput& in) {
  const PipelineModel& pm = *in.model;
  const int D = pm.num_devices(), C = pm.num_chunks();
  const auto& chunks = pm.chunks();
  const proto::DType::Value dtype = pm.activation_bytes() == 4 ? proto::DType::fp32 : proto::DType::bf16;
  auto dev = [&](int c) { return chunks[c].device; };
  auto rank = [&](int d) { return in.dp_rank * D + d; };
  // Local chunk index of each chunk on its device.
  std::vector<int> local(C, 0), per_device(D, 0);
  for (int c = 0; c < C; ++c) local[c] = per_device[dev(c)]++;

  auto boundary_shapes = [&](int mb, int c, google::protobuf::RepeatedPtrField<proto::TensorShape>* out) {
    const Shape& s = in.mbs[mb].shape;
    const double mb_tokens = pm.BoundaryMb(s, c) * 1e6 / (static_cast<double>(pm.hidden()) * pm.activation_bytes());
    auto add = [&](int64_t seq) {
      proto::TensorShape* t = out->Add();
      t->add_dims(s.mbs);
      t->add_dims(seq);
      t->add_dims(pm.hidden());
      t->set_dtype(dtype);
    };
    add(s.seq);
    if (mb_tokens > static_cast<double>(s.mbs) * s.seq + 0.5) add(s.dec_seq);  // encoder-decoder: decoder states too
  };

  std::vector<std::vector<Event>> events(D);
  std::vector<absl::flat_hash_map<int64_t, int>> logical(D);  // buffer key -> logical id
  auto buf = [&](int d, BufKind k, int mb, int c) {
    auto [it, inserted] = logical[d].emplace(BufKey(k, mb, c), static_cast<int>(logical[d].size()));
    return it->second;
  };
  int64_t seq = 0;
  auto push = [&](int d, double t, int prio, Instruction ins, int writes = -1, int frees = -1,
                  int64_t order = -1) {
    events[d].push_back({t, prio, order >= 0 ? order : seq, std::move(ins), writes, frees});
    ++seq;
  };
  auto free_at = [&](int d, double t, int id) {
    Instruction ins;
    ins.set_micro_batch(-1);
    ins.mutable_free_buffer()->add_buffer_ids(id);
    ins.set_sim_start_ms(t);
    ins.set_sim_end_ms(t);
    push(d, t, kFree, std::move(ins), -1, id);
  };

  // Transfers indexed by producer op, for send-finish times.
  absl::flat_hash_map<int64_t, const Transfer*> transfer_of;
  for (const Transfer& x : in.sim->transfers) {
    transfer_of[(static_cast<int64_t>(x.producer.kind) << 40) | (static_cast<int64_t>(x.producer.mb) << 20) |
                x.producer.chunk] = &x;
  }
  const int64_t transfer_seq_base = 1LL << 40;  // keeps transfer order identical on both sides
  for (size_t xi = 0; xi < in.sim->transfers.size(); ++xi) {
    const Transfer& x = in.sim->transfers[xi];
    const SimOp& p = x.producer;
    const bool act = p.kind == SimOp::kForward;
    Instruction send, recv;
    send.set_micro_batch(p.mb);
    recv.set_micro_batch(p.mb);
    send.set_sim_start_ms(x.start_ms);
    send.set_sim_end_ms(x.end_ms);
    recv.set_sim_start_ms(x.start_ms);
    recv.set_sim_end_ms(x.end_ms);
    const int recv_chunk = act ? p.chunk + 1 : p.chunk - 1;
    send.set_chunk(local[p.chunk]);
    recv.set_chunk(local[recv_chunk]);
    proto::CommOp* s = act ? send.mutable_send_activation_start() : send.mutable_send_grad_start();
    proto::CommOp* r = act ? recv.mutable_recv_activation_start() : recv.mutable_recv_grad_start();
    s->set_peer(rank(x.dst));
    r->set_peer(rank(x.src));
    const int sbuf = buf(x.src, act ? BufKind::kAct : BufKind::kGrad, p.mb, p.chunk);
    const int rbuf = buf(x.dst, act ? BufKind::kRecvAct : BufKind::kRecvGrad, p.mb, p.chunk);
    s->add_buffer_ids(sbuf);
    r->add_buffer_ids(rbuf);
    boundary_shapes(p.mb, act ? p.chunk : p.chunk - 1, s->mutable_shapes());
    *r->mutable_shapes() = s->shapes();
    Instruction send_finish = send;
    proto::CommOp fin = *s;
    if (act) {
      *send_finish.mutable_send_activation_finish() = fin;
    } else {
      *send_finish.mutable_send_grad_finish() = fin;
    }
    push(x.src, x.start_ms, kSendStart, std::move(send), -1, -1, transfer_seq_base + xi);
    push(x.dst, x.start_ms, kRecvStart, std::move(recv), rbuf, -1, transfer_seq_base + xi);
    push(x.src, x.end_ms, kSendFinish, std::move(send_finish));
    free_at(x.src, x.end_ms, sbuf);
  }

  for (int d = 0; d < D; ++d) {
    for (const OpTiming& o : in.sim->ops[d]) {
      const SimOp& op = o.op;
      const int m = op.mb, c = op.chunk;
      Instruction ins;
      ins.set_micro_batch(m);
      ins.set_chunk(local[c]);
      ins.set_sim_start_ms(o.start_ms);
      ins.set_sim_end_ms(o.end_ms);
      auto finish_recv = [&](bool act, int producer_chunk, int src_chunk) {
        Instruction f;
        f.set_micro_batch(m);
        f.set_chunk(local[c]);
        f.set_sim_start_ms(o.start_ms);
        f.set_sim_end_ms(o.start_ms);
        proto::CommOp* fc = act ? f.mutable_recv_activation_finish() : f.mutable_recv_grad_finish();
        fc->set_peer(rank(dev(src_chunk)));
        fc->add_buffer_ids(buf(d, act ? BufKind::kRecvAct : BufKind::kRecvGrad, m, producer_chunk));
        boundary_shapes(m, act ? producer_chunk : producer_chunk - 1, fc->mutable_shapes());
        push(d, o.start_ms, kRecvFinishOrLoad, std::move(f));
      };
      if (op.kind == SimOp::kForward) {
        proto::Forward* fw = ins.mutable_forward();
        fw->set_recompute(static_cast<proto::RecomputeLevel::Value>(static_cast<int>(in.recompute) + 1));
        int input;
        if (c == 0) {
          input = buf(d, BufKind::kInput, m, 0);
          Instruction load;
          load.set_micro_batch(m);
          load.set_chunk(local[c]);
          load.set_sim_start_ms(o.start_ms);
          load.set_sim_end_ms(o.start_ms);
          load.mutable_load_input()->add_buffer_ids(input);
          push(d, o.start_ms, kRecvFinishOrLoad, std::move(load), input);
        } else if (dev(c - 1) != d) {
          finish_recv(true, c - 1, c - 1);
          input = buf(d, BufKind::kRecvAct, m, c - 1);
        } else {
          input = buf(d, BufKind::kAct, m, c - 1);
        }
        fw->add_input_buffers(input);
        int out = -1;
        if (c < C - 1) {
          out = buf(d, BufKind::kAct, m, c);
          fw->add_output_buffers(out);
        }
        push(d, o.start_ms, kCompute, std::move(ins), out);
        free_at(d, o.end_ms, input);
        if (c < C - 1 && dev(c + 1) == d) {
          // Consumed locally by the next chunk's forward, which frees it.
        }
      } else {
        proto::Backward* bw = ins.mutable_backward();
        bw->set_first_bw_layer(chunks[c].first_layer);
        int grad_in = -1;
        if (c < C - 1) {
          if (dev(c + 1) != d) {
            finish_recv(false, c + 1, c + 1);
            grad_in = buf(d, BufKind::kRecvGrad, m, c + 1);
          } else {
            grad_in = buf(d, BufKind::kGrad, m, c + 1);
          }
          bw->add_grad_input_buffers(grad_in);
        }
        int out = -1;
        if (c > 0) {
          out = buf(d, BufKind::kGrad, m, c);
          bw->add_grad_output_buffers(out);
        }
        push(d, o.start_ms, kCompute, std::move(ins), out);
        if (grad_in >= 0) free_at(d, o.end_ms, grad_in);
      }
    }
  }

  const double end = in.sim->makespan_ms;
  std::vector<proto::ExecutionPlan> plans(D);
  for (int d = 0; d < D; ++d) {
    if (in.dp_size > 1) {
      Instruction ar;
      ar.set_micro_batch(-1);
      ar.set_sim_start_ms(end);
      ar.set_sim_end_ms(end);
      for (int g = 0; g < in.dp_size; ++g) ar.mutable_all_reduce_grads()->add_dp_peers(g * D + d);
      push(d, end, kEnd, std::move(ar));
    }
    Instruction step;
    step.set_micro_batch(-1);
    step.set_sim_start_ms(end);
    step.set_sim_end_ms(end);
    step.mutable_optimizer_step();
    push(d, end, kEnd + 1, std::move(step));

    std::vector<Event>& ev = events[d];
    std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
      if (a.t != b.t) return a.t < b.t;
      if (a.prio != b.prio) return a.prio < b.prio;
      return a.seq < b.seq;
    });

    // Interval colouring: a logical buffer takes the lowest free slot when
    // first written and returns it when freed.
    std::vector<int> slot(logical[d].size(), -1);
    std::priority_queue<int, std::vector<int>, std::greater<int>> free_slots;
    int num_slots = 0;
    auto map_ids = [&](google::protobuf::RepeatedField<int32_t>* ids) {
      for (int& id : *ids) id = slot[id] >= 0 ? slot[id] : -1 - id;  // unmapped: negative, caught by validation
    };
    proto::ExecutionPlan& plan = plans[d];
    plan.set_schema_version(kPlanSchemaVersion);
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
    for (size_t m = 0; m < in.mbs.size(); ++m) {
      const MicroBatch& mb = in.mbs[m];
      proto::MicroBatch* pmb = plan.add_micro_batches();
      pmb->set_index(static_cast<int>(m));
      pmb->set_rows(mb.shape.mbs);
      pmb->set_seq_len(mb.shape.seq);
      pmb->set_dec_seq_len(mb.shape.dec_seq);
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
    plan.mutable_instructions()->Reserve(static_cast<int>(ev.size()));
    for (Event& e : ev) {
      if (e.writes >= 0 && slot[e.writes] < 0) {
        if (free_slots.empty()) {
          slot[e.writes] = num_slots++;
        } else {
          slot[e.writes] = free_slots.top();
          free_slots.pop();
        }
      }
      Instruction& ins = e.ins;
      switch (ins.op_case()) {
        case Instruction::kLoadInput: map_ids(ins.mutable_load_input()->mutable_buffer_ids()); break;
        case Instruction::kForward:
          map_ids(ins.mutable_forward()->mutable_input_buffers());
          map_ids(ins.mutable_forward()->mutable_output_buffers());
          break;
        case Instruction::kBackward:
          map_ids(ins.mutable_backward()->mutable_grad_input_buffers());
          map_ids(ins.mutable_backward()->mutable_grad_output_buffers());
          break;
        case Instruction::kSendActivationStart: map_ids(ins.mutable_send_activation_start()->mutable_buffer_ids()); break;
        case Instruction::kSendActivationFinish: map_ids(ins.mutable_send_activation_finish()->mutable_buffer_ids()); break;
        case Instruction::kRecvActivationStart: map_ids(ins.mutable_recv_activation_start()->mutable_buffer_ids()); break;
        case Instruction::kRecvActivationFinish: map_ids(ins.mutable_recv_activation_finish()->mutable_buffer_ids()); break;
        case Instruction::kSendGradStart: map_ids(ins.mutable_send_grad_start()->mutable_buffer_ids()); break;
        case Instruction::kSendGradFinish: map_ids(ins.mutable_send_grad_finish()->mutable_buffer_ids()); break;
        case Instruction::kRecvGradStart: map_ids(ins.mutable_recv_grad_start()->mutable_buffer_ids()); break;
        case Instruction::kRecvGradFinish: map_ids(ins.mutable_recv_grad_finish()->mutable_buffer_ids()); break;
        case Instruction::kFreeBuffer: map_ids(ins.mutable_free_buffer()->mutable_buffer_ids()); break;
        default: break;
      }
      if (e.frees >= 0 && slot[e.frees] >= 0) free_slots.push(slot[e.frees]);
      *plan.add_instructions() = std::move(ins);
    }
    plan.set_num_buffer_slots(num_slots);
    plan.set_recompute(static_cast<proto::RecomputeLevel::Value>(static_cast<int>(in.recompute) + 1));
    plan.set_schedule(in.schedule == ScheduleKind::kOneFOneB         ? proto::ScheduleSpec::one_f_one_b
                      : in.schedule == ScheduleKind::kInterleaved1F1B ? proto::ScheduleSpec::interleaved_1f1b
                                                                      : proto::ScheduleSpec::wait_free_cyclic);
    plan.set_predicted_iteration_ms(in.predicted_iteration_ms);
    plan.set_predicted_peak_memory_mb(in.sim->peak_mb[d]);
    SealPlan(&plan);
  }
  return plans;
}

}  // namespace dynapipe::planner
