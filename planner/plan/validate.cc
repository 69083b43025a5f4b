#include "planner/plan/validate.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "planner/plan/instructions.h"
#include "src/common/status_macros.h"
#include "src/plan/plan_seal.h"
#include <set>

namespace dynapipe::planner {
namespace {

using proto::Instruction;

absl::Status Bad(int rank, int index, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("plan rank ", rank, " instruction ", index, ": ", what));
}

const proto::CommOp* CommOf(const Instruction& ins, bool* send, bool* start, bool* act) {
  switch (ins.op_case()) {
    case Instruction::kSendActivationStart: *send = true, *start = true, *act = true; return &ins.send_activation_start();
    case Instruction::kSendActivationFinish: *send = true, *start = false, *act = true; return &ins.send_activation_finish();
    case Instruction::kRecvActivationStart: *send = false, *start = true, *act = true; return &ins.recv_activation_start();
    case Instruction::kRecvActivationFinish: *send = false, *start = false, *act = true; return &ins.recv_activation_finish();
    case Instruction::kSendGradStart: *send = true, *start = true, *act = false; return &ins.send_grad_start();
    case Instruction::kSendGradFinish: *send = true, *start = false, *act = false; return &ins.send_grad_finish();
    case Instruction::kRecvGradStart: *send = false, *start = true, *act = false; return &ins.recv_grad_start();
    case Instruction::kRecvGradFinish: *send = false, *start = false, *act = false; return &ins.recv_grad_finish();
    default: return nullptr;
  }
}

bool SameShapes(const proto::CommOp& a, const proto::CommOp& b) {
  if (a.shapes_size() != b.shapes_size()) return false;
  for (int i = 0; i < a.shapes_size(); ++i) {
    const proto::TensorShape &x = a.shapes(i), &y = b.shapes(i);
    if (x.dtype() != y.dtype() || x.dims_size() != y.dims_size() ||
        !std::equal(x.dims().begin(), x.dims().end(), y.dims().begin())) {
      return false;
    }
  }
  return true;
}

bool SameMicroBatch(const proto::MicroBatch& a, const proto::MicroBatch& b) {
  if (a.index() != b.index() || a.rows() != b.rows() || a.seq_len() != b.seq_len() ||
      a.dec_seq_len() != b.dec_seq_len() || a.samples_size() != b.samples_size()) {
    return false;
  }
  for (int i = 0; i < a.samples_size(); ++i) {
    const proto::PlacedSample &x = a.samples(i), &y = b.samples(i);
    if (x.id() != y.id() || x.input_len() != y.input_len() || x.target_len() != y.target_len() ||
        x.row() != y.row() || x.offset() != y.offset()) {
      return false;
    }
  }
  return true;
}

enum class Slot : uint8_t { kFree, kWritten, kReceiving, kSending };

// Per-rank buffer and op-order checks (no peers involved).
absl::Status CheckRank(const proto::ExecutionPlan& p) {
  const int r = p.rank();
  if (p.num_buffer_slots() < 0 || p.num_buffer_slots() > plan::kMaxBufferSlots) {
    return absl::InvalidArgumentError(absl::StrCat("plan rank ", r, ": num_buffer_slots ", p.num_buffer_slots(),
                                                   " outside 0..", plan::kMaxBufferSlots));
  }
  std::vector<Slot> slots(p.num_buffer_slots(), Slot::kFree);
  std::map<std::pair<int, int>, uint8_t> ops;  // (mb, chunk) -> bit 1 forward, bit 2 backward
  const int num_mb = p.micro_batches_size();
  auto slot_ok = [&](int i, int id) -> absl::Status {
    if (id < 0 || id >= static_cast<int>(slots.size())) {
      return Bad(r, i, absl::StrCat("buffer ", id, " outside 0..", slots.size() - 1));
    }
    return absl::OkStatus();
  };
  auto write = [&](int i, int id) -> absl::Status {
    if (auto s = slot_ok(i, id); !s.ok()) return s;
    if (slots[id] != Slot::kFree) return Bad(r, i, absl::StrCat("writes buffer ", id, " which is still in use"));
    slots[id] = Slot::kWritten;
    return absl::OkStatus();
  };
  auto read = [&](int i, int id) -> absl::Status {
    if (auto s = slot_ok(i, id); !s.ok()) return s;
    if (slots[id] != Slot::kWritten) return Bad(r, i, absl::StrCat("reads buffer ", id, " before it holds data"));
    return absl::OkStatus();
  };
  for (int i = 0; i < p.instructions_size(); ++i) {
    const Instruction& ins = p.instructions(i);
    if (ins.micro_batch() >= num_mb || ins.micro_batch() < -1) {
      return Bad(r, i, absl::StrCat("micro-batch ", ins.micro_batch(), " not in the plan"));
    }
    bool send, start, act;
    if (const proto::CommOp* c = CommOf(ins, &send, &start, &act)) {
      if (c->buffer_ids_size() != 1) return Bad(r, i, "a transfer names exactly one buffer");
      const int id = c->buffer_ids(0);
      if (auto s = slot_ok(i, id); !s.ok()) return s;
      if (c->peer() == r) return Bad(r, i, "transfer to itself");
      if (send && start) {
        if (slots[id] != Slot::kWritten) return Bad(r, i, absl::StrCat("sends buffer ", id, " before it holds data"));
        slots[id] = Slot::kSending;
      } else if (send) {
        if (slots[id] != Slot::kSending) return Bad(r, i, absl::StrCat("finishes a send of buffer ", id, " never started"));
        slots[id] = Slot::kWritten;
      } else if (start) {
        if (slots[id] != Slot::kFree) return Bad(r, i, absl::StrCat("receives into buffer ", id, " which is in use"));
        slots[id] = Slot::kReceiving;
      } else {
        if (slots[id] != Slot::kReceiving) return Bad(r, i, absl::StrCat("finishes a receive into buffer ", id, " never started"));
        slots[id] = Slot::kWritten;
      }
      continue;
    }
    switch (ins.op_case()) {
      case Instruction::kLoadInput:
        for (int id : ins.load_input().buffer_ids()) RETURN_IF_ERROR(write(i, id));
        break;
      case Instruction::kForward: {
        for (int id : ins.forward().input_buffers()) RETURN_IF_ERROR(read(i, id));
        for (int id : ins.forward().output_buffers()) RETURN_IF_ERROR(write(i, id));
        uint8_t& seen = ops[{ins.micro_batch(), ins.chunk()}];
        if (seen & 1) return Bad(r, i, absl::StrCat("second forward of micro-batch ", ins.micro_batch()));
        seen |= 1;
        break;
      }
      case Instruction::kBackward: {
        for (int id : ins.backward().grad_input_buffers()) RETURN_IF_ERROR(read(i, id));
        for (int id : ins.backward().grad_output_buffers()) RETURN_IF_ERROR(write(i, id));
        uint8_t& seen = ops[{ins.micro_batch(), ins.chunk()}];
        if (!(seen & 1)) return Bad(r, i, absl::StrCat("backward of micro-batch ", ins.micro_batch(), " before its forward"));
        if (seen & 2) return Bad(r, i, absl::StrCat("second backward of micro-batch ", ins.micro_batch()));
        seen |= 2;
        break;
      }
      case Instruction::kFreeBuffer:
        for (int id : ins.free_buffer().buffer_ids()) {
          RETURN_IF_ERROR(slot_ok(i, id));
          if (slots[id] != Slot::kWritten) {
            return Bad(r, i, absl::StrCat("frees buffer ", id, slots[id] == Slot::kFree ? " twice or unwritten" : " while a transfer uses it"));
          }
          slots[id] = Slot::kFree;
        }
        break;
      case Instruction::kAllReduceGrads:
      case Instruction::kOptimizerStep:
        break;
      default:
        return Bad(r, i, "instruction has no operation");
    }
  }
  for (size_t id = 0; id < slots.size(); ++id) {
    if (slots[id] != Slot::kFree) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", r, ": buffer ", id, " still in use at the end"));
    }
  }
  std::set<int> chunks;
  for (const auto& [key, bits] : ops) {
    chunks.insert(key.second);
    if (bits != 3) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", r, ": micro-batch ", key.first, " chunk ",
                                                     key.second, " lacks its ", bits == 1 ? "backward" : "forward"));
    }
  }
  if (ops.size() != static_cast<size_t>(num_mb) * chunks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan rank ", r, ": not every micro-batch runs on every local chunk"));
  }
  return absl::OkStatus();
}

// Co-simulates all ranks' streams; see the header. With `nccl_groups`, a
// run of consecutive starts is one NCCL group and a rank's groups run one
// after another: a transfer completes once both sides' groups are running,
// a group once all its transfers have, and a group runs once the rank has
// issued it and its previous group has completed (NCCL serialises a
// communicator's operations); a finish waits for its start's whole group
// (the group's streams end together).
absl::Status CoSimulate(std::span<const proto::ExecutionPlan* const> by_rank, bool nccl_groups) {
  const int n = static_cast<int>(by_rank.size());
  struct Posted {
    const proto::CommOp* op;
    bool act;
    int rank, index;
    int group;  // the rank's run of starts it belongs to
  };
  // Per ordered pair (src, dst): sends started by src, receives started by dst.
  absl::flat_hash_map<int64_t, std::vector<Posted>> sends, recvs;
  // Outstanding starts per (rank, buffer): index into the pair's list.
  absl::flat_hash_map<int64_t, size_t> outstanding;
  absl::flat_hash_map<int64_t, int> allreduce_arrivals;  // (rank) -> count reached
  auto pair = [](int a, int b) { return (static_cast<int64_t>(a) << 32) | static_cast<uint32_t>(b); };
  auto check_match = [&](const Posted& s, const Posted& rv) -> absl::Status {
    if (s.act != rv.act || !SameShapes(*s.op, *rv.op)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer mismatch: rank ", s.rank, " instruction ", s.index, " sends ", s.act ? "activation" : "gradient",
          " ", s.op->ShortDebugString(), " but rank ", rv.rank, " instruction ", rv.index, " receives ",
          rv.act ? "activation" : "gradient", " ", rv.op->ShortDebugString()));
    }
    return absl::OkStatus();
  };
  // NCCL groups: per rank, the transfers of each group (pair key, send side,
  // index in the pair's list), how many groups are issued and running.
  struct GroupOp {
    int64_t key;
    size_t index;
  };
  std::vector<std::vector<std::vector<GroupOp>>> groups(n);
  std::vector<int> issued(n, 0), running(n, 0);
  auto is_start = [](const Instruction& ins) {
    bool send, start, act;
    return CommOf(ins, &send, &start, &act) != nullptr && start;
  };
  auto posted_running = [&](const Posted& p) { return p.group < running[p.rank]; };
  auto transfer_done = [&](int64_t key, size_t index) {
    const auto s = sends.find(key), r = recvs.find(key);
    if (s == sends.end() || r == recvs.end() || s->second.size() <= index || r->second.size() <= index) return false;
    return !nccl_groups || (posted_running(s->second[index]) && posted_running(r->second[index]));
  };
  auto group_done = [&](int r, int g) {
    if (g >= running[r]) return false;
    for (const GroupOp& op : groups[r][g]) {
      if (!transfer_done(op.key, op.index)) return false;
    }
    return true;
  };
  // Starts every group whose turn has come; true if any did.
  auto run_groups = [&]() {
    bool any = false, changed = true;
    while (changed) {
      changed = false;
      for (int r = 0; r < n; ++r) {
        while (running[r] < issued[r]) {
          if (running[r] > 0 && !group_done(r, running[r] - 1)) break;
          ++running[r];
          changed = any = true;
        }
      }
    }
    return any;
  };
  std::vector<int> pc(n, 0), allreduce_count(n, 0);
  int done = 0;
  for (int r = 0; r < n; ++r) done += by_rank[r]->instructions_size() == 0;
  while (done < n) {
    bool progress = false;
    for (int r = 0; r < n; ++r) {
      const proto::ExecutionPlan& p = *by_rank[r];
      while (pc[r] < p.instructions_size()) {
        const int i = pc[r];
        const Instruction& ins = p.instructions(i);
        bool send, start, act;
        const proto::CommOp* c = CommOf(ins, &send, &start, &act);
        if (c != nullptr) {
          const int peer = c->peer();
          if (peer < 0 || peer >= n) return Bad(r, i, absl::StrCat("peer ", peer, " is not a rank of this iteration"));
          const int64_t key = send ? pair(r, peer) : pair(peer, r);
          auto& mine = send ? sends[key] : recvs[key];
          auto& theirs = send ? recvs[key] : sends[key];
          const int64_t okey = pair(r, c->buffer_ids(0)) ^ (static_cast<int64_t>(send) << 62);
          if (start) {
            const bool opens = i == 0 || !is_start(p.instructions(i - 1));
            if (opens) groups[r].emplace_back();
            const Posted posted{c, act, r, i, static_cast<int>(groups[r].size()) - 1};
            if (mine.size() < theirs.size()) {
              RETURN_IF_ERROR(send ? check_match(posted, theirs[mine.size()]) : check_match(theirs[mine.size()], posted));
            }
            outstanding[okey] = mine.size();
            groups[r].back().push_back({key, mine.size()});
            mine.push_back(posted);
            if (i + 1 == p.instructions_size() || !is_start(p.instructions(i + 1))) issued[r] = groups[r].size();
          } else {
            auto it = outstanding.find(okey);
            if (it == outstanding.end()) return Bad(r, i, "finishes a transfer it never started");
            // Gloo: the peer has posted its side. NCCL: the start's whole
            // group has completed (a group's streams end together).
            if (nccl_groups ? !group_done(r, mine[it->second].group) : !transfer_done(key, it->second)) break;
            outstanding.erase(it);
          }
        } else if (ins.op_case() == Instruction::kAllReduceGrads) {
          bool ready = true;
          for (int peer : ins.all_reduce_grads().dp_peers()) {
            if (peer < 0 || peer >= n) return Bad(r, i, absl::StrCat("all-reduce peer ", peer, " is not a rank"));
            if (peer != r && allreduce_count[peer] <= allreduce_count[r] &&
                !(pc[peer] < by_rank[peer]->instructions_size() &&
                  by_rank[peer]->instructions(pc[peer]).op_case() == Instruction::kAllReduceGrads)) {
              ready = false;
            }
          }
          if (!ready) break;
          ++allreduce_count[r];
        }
        ++pc[r];
        progress = true;
        if (pc[r] == p.instructions_size()) ++done;
      }
    }
    if (nccl_groups && run_groups()) progress = true;
    if (!progress) {
      std::string blocked;
      for (int r = 0; r < n; ++r) {
        if (pc[r] < by_rank[r]->instructions_size()) {
          absl::StrAppend(&blocked, " rank ", r, " at instruction ", pc[r], " (",
                          by_rank[r]->instructions(pc[r]).ShortDebugString().substr(0, 80), ");");
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat(nccl_groups ? "plans deadlock under NCCL's group order:" : "plans deadlock:", blocked));
    }
  }
  for (const auto& [key, list] : sends) {
    const auto it = recvs.find(key);
    const size_t nr = it == recvs.end() ? 0 : it->second.size();
    if (nr != list.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", key >> 32, " sends ", list.size(), " tensors to rank ",
                                                     static_cast<uint32_t>(key), " which receives ", nr));
    }
  }
  for (const auto& [key, list] : recvs) {
    if (!sends.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", static_cast<uint32_t>(key), " receives from rank ",
                                                     key >> 32, " which sends nothing"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlans(std::span<const proto::ExecutionPlan> plans, std::span<const int64_t> expected_sample_ids) {
  if (plans.empty()) return absl::InvalidArgumentError("no plans");
  const proto::ExecutionPlan& first = plans[0];
  const int pp = first.pp_size(), dp = first.dp_size();
  // In 64 bits: stored sizes are untrusted, and their int product can wrap.
  const int64_t world = int64_t{pp} * dp;
  if (pp <= 0 || dp <= 0 || static_cast<int64_t>(plans.size()) != world) {
    return absl::InvalidArgumentError(absl::StrCat(plans.size(), " plans for pp ", pp, " x dp ", dp));
  }
  std::vector<const proto::ExecutionPlan*> by_rank(plans.size(), nullptr);
  for (const proto::ExecutionPlan& p : plans) {
    if (p.schema_version() != plan::kPlanSchemaVersion) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", p.rank(), ": schema version ", p.schema_version(),
                                                     ", expected ", plan::kPlanSchemaVersion));
    }
    if (p.checksum() != plan::PlanChecksum(p)) {
      return absl::DataLossError(absl::StrCat("plan rank ", p.rank(), " of job ", p.job_id(), " iteration ",
                                              p.iteration(), ": checksum mismatch"));
    }
    if (p.job_id() != first.job_id() || p.iteration() != first.iteration() || p.pp_size() != pp || p.dp_size() != dp) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", p.rank(), ": job, iteration or sizes differ from rank ", first.rank()));
    }
    if (p.rank() < 0 || p.rank() >= world || by_rank[p.rank()] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", p.rank(), ": missing or repeated rank"));
    }
    if (p.rank() != int64_t{p.dp_rank()} * pp + p.pp_rank()) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", p.rank(), ": inconsistent pp/dp coordinates"));
    }
    by_rank[p.rank()] = &p;
    RETURN_IF_ERROR(CheckRank(p));
  }
  // Samples: the micro-batches of a group are the same on each of its ranks.
  absl::flat_hash_set<int64_t> seen;
  for (int g = 0; g < dp; ++g) {
    const proto::ExecutionPlan& head = *by_rank[g * pp];
    for (int s = 1; s < pp; ++s) {
      const proto::ExecutionPlan& other = *by_rank[g * pp + s];
      if (other.micro_batches_size() != head.micro_batches_size()) {
        return absl::InvalidArgumentError(absl::StrCat("plan rank ", other.rank(), ": micro-batches differ from rank ", head.rank()));
      }
      for (int m = 0; m < head.micro_batches_size(); ++m) {
        if (!SameMicroBatch(head.micro_batches(m), other.micro_batches(m))) {
          return absl::InvalidArgumentError(absl::StrCat("plan rank ", other.rank(), ": micro-batch ", m, " differs from rank ", head.rank()));
        }
      }
    }
    for (const proto::MicroBatch& mb : head.micro_batches()) {
      for (const proto::PlacedSample& s : mb.samples()) {
        if (!seen.insert(s.id()).second) {
          return absl::InvalidArgumentError(absl::StrCat("sample ", s.id(), " appears twice in iteration ", head.iteration()));
        }
      }
    }
  }
  if (!expected_sample_ids.empty()) {
    if (seen.size() != expected_sample_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("plans hold ", seen.size(), " samples, the batch has ",
                                                     expected_sample_ids.size()));
    }
    for (int64_t id : expected_sample_ids) {
      if (!seen.contains(id)) return absl::InvalidArgumentError(absl::StrCat("sample ", id, " is in no micro-batch"));
    }
  }
  // Gloo's semantics (starts never block), then NCCL's (groups in order):
  // plans run on either backend.
  RETURN_IF_ERROR(CoSimulate(by_rank, /*nccl_groups=*/false));
  return CoSimulate(by_rank, /*nccl_groups=*/true);
}

}  // namespace dynapipe::planner
