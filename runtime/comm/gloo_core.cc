// Point-to-point transfers, abort and shutdown, and the groups' meshes of a
// Gloo communicator's core (see gloo_core.h).

#include "runtime/comm/gloo_core.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/context.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "runtime/comm/gloo_support.h"
#include "src/common/logging.h"
#include "src/common/mutex.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm::gloo_internal {

using gloo_support::CatchGloo;
using gloo_support::ConnectMesh;
using gloo_support::OneLine;
using gloo_support::TimeoutUntil;
using Millis = std::chrono::milliseconds;

Transfer::~Transfer() {
  bool pending;
  {
    MutexLock lock(&core_->mu_);
    pending = core_->live_.contains(this);
  }
  if (!pending) return;
  // Gloo holds only a weak pointer to the buffer: bytes arriving for it after
  // this would stall the connection for good. Fail everything fast instead.
  core_->Abort(absl::StrCat(Describe(), " was destroyed before it completed"));
  MutexLock lock(&core_->mu_);
  core_->live_.erase(this);
  buffer_.reset();
}

absl::Status Transfer::Wait(absl::Time deadline) {
  if (result_.has_value()) return *result_;
  if (core_->aborted()) return *(result_ = core_->AbortedError(Describe()));
  const absl::Time start = absl::Now();
  bool completed = false;
  std::string error;
  try {
    const Millis timeout = TimeoutUntil(deadline);
    completed =
        direction_ == Direction::kSend ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
  } catch (const std::exception& e) {
    error = OneLine(e.what());
  } catch (...) {
    error = "unknown exception";
  }
  absl::Status status;
  if (completed) {
    MutexLock lock(&core_->mu_);
    core_->live_.erase(this);
    buffer_.reset();
  } else if (core_->aborting()) {
    // Returned false (Abort interrupted the wait) or the connection failed
    // because Abort closed it.
    status = core_->AbortedError(Describe());
  } else if (absl::StrContains(error, "Timed out waiting")) {
    // Before throwing, Gloo has closed every connection of this mesh.
    status = WithLostPeer(absl::DeadlineExceededError(absl::StrCat(Describe(), " did not complete within ",
                                                                   absl::FormatDuration(absl::Now() - start))),
                          peer_);
  } else if (!error.empty()) {
    status = WithLostPeer(
        absl::UnavailableError(absl::StrCat(Describe(), ": connection to rank ", peer_, " failed: ", error)), peer_);
  } else {
    status = absl::InternalError(absl::StrCat(Describe(), ": wait interrupted without an abort"));
  }
  if (!status.ok() && !absl::IsAborted(status)) core_->Abort(status);
  return *(result_ = status);
}

absl::StatusOr<std::unique_ptr<Transfer>> Core::Start(const std::shared_ptr<gloo::Context>& context,
                                                      Direction direction, int context_peer,
                                                      int peer, uint64_t slot, std::string label,
                                                      void* data, size_t bytes) {
  auto transfer =
      std::make_unique<Transfer>(shared_from_this(), direction, peer, bytes, std::move(label));
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  RETURN_IF_ERROR(
      CatchGloo(transfer->Describe(), [&] { buffer = context->createUnboundBuffer(data, bytes); }));
  gloo::transport::UnboundBuffer* const raw = buffer.get();
  {
    MutexLock lock(&mu_);
    if (aborting_) return AbortedErrorLocked(transfer->Describe());
    transfer->buffer_ = std::move(buffer);
    live_.insert(transfer.get());
  }
  // Outside mu_: an Abort meanwhile closes the pair first, so this throws or
  // the wait sees the abort.
  absl::Status status =
      CatchGloo(absl::StrCat(transfer->Describe(), ": connection to rank ", peer, " failed"), [&] {
        if (direction == Direction::kSend) {
          raw->send(context_peer, slot, 0, bytes);
        } else {
          raw->recv(context_peer, slot, 0, bytes);
        }
      });
  if (!status.ok()) {
    if (aborting()) return AbortedError(transfer->Describe());
    status = WithLostPeer(std::move(status), peer);
    Abort(status);
    return status;  // the transfer is destroyed after the abort closed its pair
  }
  return transfer;
}

absl::StatusOr<std::unique_ptr<Request>> Core::StartP2P(Direction direction, int peer, uint64_t tag,
                                                        void* data, size_t bytes) {
  if (peer < 0 || peer >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer: rank ", peer, " is out of range for a world of ", size_, " ranks"));
  }
  if (peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("peer: rank ", peer, " is this rank"));
  }
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("data: null for ", bytes, " bytes"));
  }
  // World ranks are the mesh's ranks; the tag is Gloo's slot.
  ASSIGN_OR_RETURN(
      std::unique_ptr<Transfer> transfer,
      Start(world_, direction, peer, peer, tag, absl::StrCat("tag ", tag), data, bytes));
  return std::unique_ptr<Request>(std::move(transfer));
}

void Core::Abort(const absl::Status& cause) {
  const absl::string_view reason = cause.message();
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  {
    MutexLock lock(&mu_);
    if (aborting_) {
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_; });
      return;
    }
    aborting_ = true;
    abort_reason_ = std::string(reason);
    abort_lost_peer_ = LostPeer(cause);
    contexts = contexts_;
  }
  spdlog::warn("rank {}: aborting communicator: {}", rank_, reason);
  // Gloo's close() resets the connection (SO_LINGER 0) and returns once its
  // I/O thread no longer touches the pair, so no buffer is written after this.
  // It does not wake local waiters; AbortWait below does.
  for (const auto& context : contexts) {
    const absl::Status status =
        CatchGloo("closing connections", [&] { context->closeConnections(); });
    if (!status.ok()) spdlog::warn("rank {}: {}", rank_, status.message());
  }
  MutexLock lock(&mu_);
  aborted_ = true;
  // Gloo's abort flags are sticky: a wait that starts after this returns at once.
  for (Transfer* transfer : live_) {
    if (transfer->direction_ == Direction::kSend) {
      transfer->buffer_->abortWaitSend();
    } else {
      transfer->buffer_->abortWaitRecv();
    }
  }
}

void Core::Shutdown() {
  // Stop the collective thread from taking new work first: a collective it
  // still runs could otherwise start a transfer after the check below.
  bool collectives_busy;
  {
    MutexLock lock(&queue_mu_);
    stop_ = true;
    collectives_busy = collective_running_ || !queue_.empty();
  }
  size_t in_flight;
  {
    MutexLock lock(&mu_);
    in_flight = live_.size();
  }
  if (in_flight > 0 || collectives_busy) {
    Abort(absl::StrCat("communicator destroyed with ", in_flight, " transfers in flight",
                       collectives_busy ? " and collectives unfinished" : ""));
  }
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  std::map<std::vector<int>, std::shared_ptr<Group>> groups;
  {
    MutexLock lock(&mu_);
    if (!aborting_) abort_reason_ = "communicator destroyed";
    aborting_ = aborted_ = true;
    contexts.swap(contexts_);
    groups.swap(groups_);
  }
  world_.reset();
  // Queued collectives fail at once (aborted); the thread ends with the queue.
  std::thread thread;
  {
    MutexLock lock(&queue_mu_);
    thread = std::move(collective_thread_);
  }
  if (thread.joinable()) thread.join();
  // Destroying the last references closes the sockets (after unlocking mu_:
  // closing waits for Gloo's I/O thread).
}

absl::Status Core::CheckGroup(const std::vector<int>& ranks) const {
  if (ranks.empty()) return absl::InvalidArgumentError("group: empty");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group: rank ", ranks[i], " is out of range for a world of ", size_, " ranks"));
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("group: rank ", ranks[i], " is listed twice"));
    }
  }
  if (!std::binary_search(ranks.begin(), ranks.end(), rank_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("group: this rank (", rank_, ") is not in {", absl::StrJoin(ranks, ","), "}"));
  }
  return absl::OkStatus();
}

std::shared_ptr<Core::Group> Core::FindGroup(const std::vector<int>& ranks) {
  MutexLock lock(&mu_);
  std::shared_ptr<Group>& group = groups_[ranks];
  if (group == nullptr) {
    group = std::make_shared<Group>();
    group->ranks = ranks;
    group->index = std::lower_bound(ranks.begin(), ranks.end(), rank_) - ranks.begin();
  }
  return group;
}

absl::StatusOr<std::shared_ptr<gloo::Context>> Core::Connect(Group& group, absl::Time deadline) {
  if (group.context != nullptr) return group.context;
  const std::string members = absl::StrCat("{", absl::StrJoin(group.ranks, ","), "}");
  const absl::Time connect_deadline = std::min(deadline, absl::Now() + connect_timeout_);
  auto context = std::make_shared<gloo::rendezvous::Context>(group.index, group.ranks.size());
  absl::Status status =
      ConnectMesh(*context, device_, store_,
                  absl::StrCat(job_prefix_, "/group/", absl::StrJoin(group.ranks, ","), "/"),
                  connect_deadline, [this] { return aborting(); });
  if (!status.ok()) {
    if (aborting()) return AbortedError(absl::StrCat("connecting group ", members));
    status = Annotate(status, absl::StrCat("connecting group ", members));
    Abort(status.message());
    return status;
  }
  {
    MutexLock lock(&mu_);
    if (!aborting_) {
      contexts_.push_back(context);
      group.context = context;
      spdlog::debug("rank {}: connected all-reduce group {}", rank_, members);
      return group.context;
    }
  }
  // Abort ran while we connected and could not see this mesh.
  CatchGloo("closing connections", [&] { context->closeConnections(); }).IgnoreError();
  return AbortedError(absl::StrCat("connecting group ", members));
}

}  // namespace dynapipe::runtime::comm::gloo_internal
