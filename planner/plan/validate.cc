#include "planner/plan/validate.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
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

// Per-rank buffer and op-order checks (no peers involved), instruction by
// instruction; the first failure is returned.
class RankChecker {
 public:
  explicit RankChecker(const proto::ExecutionPlan& p)
      : p_(p), r_(p.rank()), num_mb_(p.micro_batches_size()), slots_(p.num_buffer_slots(), Slot::kFree) {}

  absl::Status CheckInstruction(int i);
  absl::Status CheckAllFree() const;
  absl::Status CheckEveryOpRan() const;

 private:
  absl::Status SlotOk(int i, int id) const {
    if (id < 0 || id >= static_cast<int>(slots_.size())) {
      return Bad(r_, i, absl::StrCat("buffer ", id, " outside 0..", slots_.size() - 1));
    }
    return absl::OkStatus();
  }
  absl::Status Write(int i, int id) {
    if (auto s = SlotOk(i, id); !s.ok()) return s;
    if (slots_[id] != Slot::kFree) return Bad(r_, i, absl::StrCat("writes buffer ", id, " which is still in use"));
    slots_[id] = Slot::kWritten;
    return absl::OkStatus();
  }
  absl::Status Read(int i, int id) const {
    if (auto s = SlotOk(i, id); !s.ok()) return s;
    if (slots_[id] != Slot::kWritten) return Bad(r_, i, absl::StrCat("reads buffer ", id, " before it holds data"));
    return absl::OkStatus();
  }
  absl::Status CheckTransfer(int i, const proto::CommOp& c, bool send, bool start);
  absl::Status CheckCompute(int i, const Instruction& ins);
  absl::Status CheckFree(int i, const Instruction& ins);

  const proto::ExecutionPlan& p_;
  const int r_;
  const int num_mb_;
  std::vector<Slot> slots_;
  std::map<std::pair<int, int>, uint8_t> ops_;  // (mb, chunk) -> bit 1 forward, bit 2 backward
};

absl::Status RankChecker::CheckInstruction(int i) {
  const Instruction& ins = p_.instructions(i);
  if (ins.micro_batch() >= num_mb_ || ins.micro_batch() < -1) {
    return Bad(r_, i, absl::StrCat("micro-batch ", ins.micro_batch(), " not in the plan"));
  }
  bool send, start, act;
  if (const proto::CommOp* c = CommOf(ins, &send, &start, &act)) return CheckTransfer(i, *c, send, start);
  switch (ins.op_case()) {
    case Instruction::kLoadInput:
      for (int id : ins.load_input().buffer_ids()) RETURN_IF_ERROR(Write(i, id));
      return absl::OkStatus();
    case Instruction::kForward:
    case Instruction::kBackward: return CheckCompute(i, ins);
    case Instruction::kFreeBuffer: return CheckFree(i, ins);
    case Instruction::kAllReduceGrads:
    case Instruction::kOptimizerStep: return absl::OkStatus();
    default: return Bad(r_, i, "instruction has no operation");
  }
}

// A transfer moves its one buffer through the slot states in order.
absl::Status RankChecker::CheckTransfer(int i, const proto::CommOp& c, bool send, bool start) {
  if (c.buffer_ids_size() != 1) return Bad(r_, i, "a transfer names exactly one buffer");
  const int id = c.buffer_ids(0);
  if (auto s = SlotOk(i, id); !s.ok()) return s;
  if (c.peer() == r_) return Bad(r_, i, "transfer to itself");
  if (send && start) {
    if (slots_[id] != Slot::kWritten) return Bad(r_, i, absl::StrCat("sends buffer ", id, " before it holds data"));
    slots_[id] = Slot::kSending;
  } else if (send) {
    if (slots_[id] != Slot::kSending) return Bad(r_, i, absl::StrCat("finishes a send of buffer ", id, " never started"));
    slots_[id] = Slot::kWritten;
  } else if (start) {
    if (slots_[id] != Slot::kFree) return Bad(r_, i, absl::StrCat("receives into buffer ", id, " which is in use"));
    slots_[id] = Slot::kReceiving;
  } else {
    if (slots_[id] != Slot::kReceiving) return Bad(r_, i, absl::StrCat("finishes a receive into buffer ", id, " never started"));
    slots_[id] = Slot::kWritten;
  }
  return absl::OkStatus();
}

// A forward or backward: its buffers, and each (micro-batch, chunk) runs one
// forward and then one backward.
absl::Status RankChecker::CheckCompute(int i, const Instruction& ins) {
  if (ins.op_case() == Instruction::kForward) {
    for (int id : ins.forward().input_buffers()) RETURN_IF_ERROR(Read(i, id));
    for (int id : ins.forward().output_buffers()) RETURN_IF_ERROR(Write(i, id));
    uint8_t& seen = ops_[{ins.micro_batch(), ins.chunk()}];
    if (seen & 1) return Bad(r_, i, absl::StrCat("second forward of micro-batch ", ins.micro_batch()));
    seen |= 1;
    return absl::OkStatus();
  }
  for (int id : ins.backward().grad_input_buffers()) RETURN_IF_ERROR(Read(i, id));
  for (int id : ins.backward().grad_output_buffers()) RETURN_IF_ERROR(Write(i, id));
  uint8_t& seen = ops_[{ins.micro_batch(), ins.chunk()}];
  if (!(seen & 1)) return Bad(r_, i, absl::StrCat("backward of micro-batch ", ins.micro_batch(), " before its forward"));
  if (seen & 2) return Bad(r_, i, absl::StrCat("second backward of micro-batch ", ins.micro_batch()));
  seen |= 2;
  return absl::OkStatus();
}

absl::Status RankChecker::CheckFree(int i, const Instruction& ins) {
  for (int id : ins.free_buffer().buffer_ids()) {
    RETURN_IF_ERROR(SlotOk(i, id));
    if (slots_[id] != Slot::kWritten) {
      return Bad(r_, i, absl::StrCat("frees buffer ", id, slots_[id] == Slot::kFree ? " twice or unwritten" : " while a transfer uses it"));
    }
    slots_[id] = Slot::kFree;
  }
  return absl::OkStatus();
}

absl::Status RankChecker::CheckAllFree() const {
  for (size_t id = 0; id < slots_.size(); ++id) {
    if (slots_[id] != Slot::kFree) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", r_, ": buffer ", id, " still in use at the end"));
    }
  }
  return absl::OkStatus();
}

// Every micro-batch ran forward and backward on every local chunk.
absl::Status RankChecker::CheckEveryOpRan() const {
  std::set<int> chunks;
  for (const auto& [key, bits] : ops_) {
    chunks.insert(key.second);
    if (bits != 3) {
      return absl::InvalidArgumentError(absl::StrCat("plan rank ", r_, ": micro-batch ", key.first, " chunk ",
                                                     key.second, " lacks its ", bits == 1 ? "backward" : "forward"));
    }
  }
  if (ops_.size() != static_cast<size_t>(num_mb_) * chunks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan rank ", r_, ": not every micro-batch runs on every local chunk"));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(const proto::ExecutionPlan& p) {
  const int r = p.rank();
  if (p.num_buffer_slots() < 0 || p.num_buffer_slots() > plan::kMaxBufferSlots) {
    return absl::InvalidArgumentError(absl::StrCat("plan rank ", r, ": num_buffer_slots ", p.num_buffer_slots(),
                                                   " outside 0..", plan::kMaxBufferSlots));
  }
  RankChecker checker(p);
  for (int i = 0; i < p.instructions_size(); ++i) RETURN_IF_ERROR(checker.CheckInstruction(i));
  RETURN_IF_ERROR(checker.CheckAllFree());
  return checker.CheckEveryOpRan();
}

// Co-simulates all ranks' streams; see the header. With `nccl_groups`, a
// run of consecutive starts is one NCCL group and a rank's groups run one
// after another: a transfer completes once both sides' groups are running,
// a group once all its transfers have, and a group runs once the rank has
// issued it and its previous group has completed (NCCL serialises a
// communicator's operations); a finish waits for its start's whole group
// (the group's streams end together).
class CoSimulator {
 public:
  CoSimulator(std::span<const proto::ExecutionPlan* const> by_rank, bool nccl_groups)
      : by_rank_(by_rank), n_(static_cast<int>(by_rank.size())), nccl_groups_(nccl_groups), groups_(n_),
        issued_(n_, 0), running_(n_, 0), pc_(n_, 0), allreduce_count_(n_, 0) {}

  absl::Status Run();

 private:
  struct Posted {
    const proto::CommOp* op;
    bool act;
    int rank, index;
    int group;  // the rank's run of starts it belongs to
  };
  // One transfer of an NCCL group: pair key and index in the pair's lists.
  struct GroupOp {
    int64_t key;
    size_t index;
  };

  static int64_t Pair(int a, int b) { return (static_cast<int64_t>(a) << 32) | static_cast<uint32_t>(b); }
  static bool IsStart(const Instruction& ins) {
    bool send, start, act;
    return CommOf(ins, &send, &start, &act) != nullptr && start;
  }
  static absl::Status CheckMatch(const Posted& s, const Posted& rv);
  bool PostedRunning(const Posted& p) const { return p.group < running_[p.rank]; }
  bool TransferDone(int64_t key, size_t index) const;
  bool GroupDone(int r, int g) const;
  bool RunGroups();
  absl::Status AdvanceRank(int r, bool* progress, int* done);
  absl::StatusOr<bool> StepTransfer(int r, int i, const proto::CommOp* c, bool send, bool start, bool act);
  absl::StatusOr<bool> StepAllReduce(int r, int i, const Instruction& ins);
  absl::Status Deadlock() const;
  absl::Status CheckPairsMatched() const;

  const std::span<const proto::ExecutionPlan* const> by_rank_;
  const int n_;
  const bool nccl_groups_;
  // Per ordered pair (src, dst): sends started by src, receives started by dst.
  absl::flat_hash_map<int64_t, std::vector<Posted>> sends_, recvs_;
  // Outstanding starts per (rank, buffer): index into the pair's list.
  absl::flat_hash_map<int64_t, size_t> outstanding_;
  // NCCL groups: per rank, the transfers of each group, how many groups are
  // issued and running.
  std::vector<std::vector<std::vector<GroupOp>>> groups_;
  std::vector<int> issued_, running_;
  std::vector<int> pc_, allreduce_count_;  // per rank: next instruction, all-reduces passed
};

absl::Status CoSimulator::CheckMatch(const Posted& s, const Posted& rv) {
  if (s.act != rv.act || !SameShapes(*s.op, *rv.op)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer mismatch: rank ", s.rank, " instruction ", s.index, " sends ", s.act ? "activation" : "gradient",
        " ", s.op->ShortDebugString(), " but rank ", rv.rank, " instruction ", rv.index, " receives ",
        rv.act ? "activation" : "gradient", " ", rv.op->ShortDebugString()));
  }
  return absl::OkStatus();
}

bool CoSimulator::TransferDone(int64_t key, size_t index) const {
  const auto s = sends_.find(key), r = recvs_.find(key);
  if (s == sends_.end() || r == recvs_.end() || s->second.size() <= index || r->second.size() <= index) return false;
  return !nccl_groups_ || (PostedRunning(s->second[index]) && PostedRunning(r->second[index]));
}

bool CoSimulator::GroupDone(int r, int g) const {
  if (g >= running_[r]) return false;
  for (const GroupOp& op : groups_[r][g]) {
    if (!TransferDone(op.key, op.index)) return false;
  }
  return true;
}

// Starts every group whose turn has come; true if any did.
bool CoSimulator::RunGroups() {
  bool any = false, changed = true;
  while (changed) {
    changed = false;
    for (int r = 0; r < n_; ++r) {
      while (running_[r] < issued_[r]) {
        if (running_[r] > 0 && !GroupDone(r, running_[r] - 1)) break;
        ++running_[r];
        changed = any = true;
      }
    }
  }
  return any;
}

absl::Status CoSimulator::Run() {
  int done = 0;
  for (int r = 0; r < n_; ++r) done += by_rank_[r]->instructions_size() == 0;
  while (done < n_) {
    bool progress = false;
    for (int r = 0; r < n_; ++r) RETURN_IF_ERROR(AdvanceRank(r, &progress, &done));
    if (nccl_groups_ && RunGroups()) progress = true;
    if (!progress) return Deadlock();
  }
  return CheckPairsMatched();
}

// Runs rank r's stream until an instruction must wait or the stream ends.
absl::Status CoSimulator::AdvanceRank(int r, bool* progress, int* done) {
  const proto::ExecutionPlan& p = *by_rank_[r];
  while (pc_[r] < p.instructions_size()) {
    const int i = pc_[r];
    const Instruction& ins = p.instructions(i);
    bool send, start, act;
    const proto::CommOp* c = CommOf(ins, &send, &start, &act);
    bool ran = true;
    if (c != nullptr) {
      ASSIGN_OR_RETURN(ran, StepTransfer(r, i, c, send, start, act));
    } else if (ins.op_case() == Instruction::kAllReduceGrads) {
      ASSIGN_OR_RETURN(ran, StepAllReduce(r, i, ins));
    }
    if (!ran) break;
    ++pc_[r];
    *progress = true;
    if (pc_[r] == p.instructions_size()) ++*done;
  }
  return absl::OkStatus();
}

// A start posts its side (checked against the peer's matching one); a finish
// runs once its transfer (Gloo) or its start's group (NCCL) is done. False:
// the instruction must wait.
absl::StatusOr<bool> CoSimulator::StepTransfer(int r, int i, const proto::CommOp* c, bool send, bool start,
                                               bool act) {
  const proto::ExecutionPlan& p = *by_rank_[r];
  const int peer = c->peer();
  if (peer < 0 || peer >= n_) return Bad(r, i, absl::StrCat("peer ", peer, " is not a rank of this iteration"));
  const int64_t key = send ? Pair(r, peer) : Pair(peer, r);
  auto& mine = send ? sends_[key] : recvs_[key];
  auto& theirs = send ? recvs_[key] : sends_[key];
  const int64_t okey = Pair(r, c->buffer_ids(0)) ^ (static_cast<int64_t>(send) << 62);
  if (start) {
    const bool opens = i == 0 || !IsStart(p.instructions(i - 1));
    if (opens) groups_[r].emplace_back();
    const Posted posted{c, act, r, i, static_cast<int>(groups_[r].size()) - 1};
    if (mine.size() < theirs.size()) {
      RETURN_IF_ERROR(send ? CheckMatch(posted, theirs[mine.size()]) : CheckMatch(theirs[mine.size()], posted));
    }
    outstanding_[okey] = mine.size();
    groups_[r].back().push_back({key, mine.size()});
    mine.push_back(posted);
    if (i + 1 == p.instructions_size() || !IsStart(p.instructions(i + 1))) issued_[r] = groups_[r].size();
    return true;
  }
  auto it = outstanding_.find(okey);
  if (it == outstanding_.end()) return Bad(r, i, "finishes a transfer it never started");
  // Gloo: the peer has posted its side. NCCL: the start's whole group has
  // completed (a group's streams end together).
  if (nccl_groups_ ? !GroupDone(r, mine[it->second].group) : !TransferDone(key, it->second)) return false;
  outstanding_.erase(it);
  return true;
}

// The gradient all-reduce waits until every peer of its group has reached it.
absl::StatusOr<bool> CoSimulator::StepAllReduce(int r, int i, const Instruction& ins) {
  bool ready = true;
  for (int peer : ins.all_reduce_grads().dp_peers()) {
    if (peer < 0 || peer >= n_) return Bad(r, i, absl::StrCat("all-reduce peer ", peer, " is not a rank"));
    if (peer != r && allreduce_count_[peer] <= allreduce_count_[r] &&
        !(pc_[peer] < by_rank_[peer]->instructions_size() &&
          by_rank_[peer]->instructions(pc_[peer]).op_case() == Instruction::kAllReduceGrads)) {
      ready = false;
    }
  }
  if (!ready) return false;
  ++allreduce_count_[r];
  return true;
}

absl::Status CoSimulator::Deadlock() const {
  std::string blocked;
  for (int r = 0; r < n_; ++r) {
    if (pc_[r] < by_rank_[r]->instructions_size()) {
      absl::StrAppend(&blocked, " rank ", r, " at instruction ", pc_[r], " (",
                      by_rank_[r]->instructions(pc_[r]).ShortDebugString().substr(0, 80), ");");
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(nccl_groups_ ? "plans deadlock under NCCL's group order:" : "plans deadlock:", blocked));
}

// Every pair's sends and receives were all matched.
absl::Status CoSimulator::CheckPairsMatched() const {
  for (const auto& [key, list] : sends_) {
    const auto it = recvs_.find(key);
    const size_t nr = it == recvs_.end() ? 0 : it->second.size();
    if (nr != list.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", key >> 32, " sends ", list.size(), " tensors to rank ",
                                                     static_cast<uint32_t>(key), " which receives ", nr));
    }
  }
  for (const auto& [key, list] : recvs_) {
    if (!sends_.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", static_cast<uint32_t>(key), " receives from rank ",
                                                     key >> 32, " which sends nothing"));
    }
  }
  return absl::OkStatus();
}

absl::Status CoSimulate(std::span<const proto::ExecutionPlan* const> by_rank, bool nccl_groups) {
  return CoSimulator(by_rank, nccl_groups).Run();
}

}  // namespace

absl::Status ValidatePlans(std::span<const proto::ExecutionPlan> plans, std::span<const int64_t> expected_sample_ids,
                           const ValidateOptions& options) {
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
    if (options.checksums && p.checksum() != plan::PlanChecksum(p)) {
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
