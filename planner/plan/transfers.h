#pragma once

// Which transfer a plan instruction belongs to. Plans name a transfer by its
// kind (activation or gradient), its two ranks and its micro-batch; the k-th
// send of a key on one rank meets the k-th receive of that key on the peer.
// Shared by the replay (plan/replay.h) and the trace writer (cli/trace.h).

#include <compare>
#include <optional>

#include "proto/plan.pb.h"

namespace dynapipe::planner {

struct TransferKey {
  bool activation = false;
  int from = -1, to = -1;  // global ranks
  int micro_batch = -1;
  auto operator<=>(const TransferKey&) const = default;
};

enum class TransferStep { kSendStart, kSendFinish, kRecvStart, kRecvFinish };

struct TransferOp {
  TransferKey key;
  TransferStep step;
};

// The transfer instruction `ins` of rank `rank` starts or waits for; nullopt
// for any other instruction.
inline std::optional<TransferOp> TransferOf(const proto::Instruction& ins, int rank) {
  using I = proto::Instruction;
  const int mb = ins.micro_batch();
  auto send = [&](bool act, const proto::CommOp& op, TransferStep step) {
    return TransferOp{{act, rank, op.peer(), mb}, step};
  };
  auto recv = [&](bool act, const proto::CommOp& op, TransferStep step) {
    return TransferOp{{act, op.peer(), rank, mb}, step};
  };
  switch (ins.op_case()) {
    case I::kSendActivationStart: return send(true, ins.send_activation_start(), TransferStep::kSendStart);
    case I::kSendActivationFinish: return send(true, ins.send_activation_finish(), TransferStep::kSendFinish);
    case I::kSendGradStart: return send(false, ins.send_grad_start(), TransferStep::kSendStart);
    case I::kSendGradFinish: return send(false, ins.send_grad_finish(), TransferStep::kSendFinish);
    case I::kRecvActivationStart: return recv(true, ins.recv_activation_start(), TransferStep::kRecvStart);
    case I::kRecvActivationFinish: return recv(true, ins.recv_activation_finish(), TransferStep::kRecvFinish);
    case I::kRecvGradStart: return recv(false, ins.recv_grad_start(), TransferStep::kRecvStart);
    case I::kRecvGradFinish: return recv(false, ins.recv_grad_finish(), TransferStep::kRecvFinish);
    default: return std::nullopt;
  }
}

}  // namespace dynapipe::planner
