#include "runtime/comm/gloo_comm.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "runtime/comm/gloo_core.h"
#include "runtime/comm/gloo_support.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm {
namespace {

using gloo_internal::Core;
using gloo_internal::Direction;
using gloo_support::CatchGloo;
using gloo_support::ConnectMesh;

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~GlooCommunicator() override { core_->Shutdown(); }

  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  absl::StatusOr<std::unique_ptr<Request>> Send(int peer, uint64_t tag, const void* data,
                                                size_t bytes) override {
    // Gloo's buffers are not const-qualified; a send only reads.
    return core_->StartP2P(Direction::kSend, peer, tag, const_cast<void*>(data), bytes);
  }
  absl::StatusOr<std::unique_ptr<Request>> Recv(int peer, uint64_t tag, void* data,
                                                size_t bytes) override {
    return core_->StartP2P(Direction::kRecv, peer, tag, data, bytes);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, float* data, size_t n,
                            absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  absl::Status AllReduceSum(absl::Span<const int> group, double* data, size_t n,
                            absl::Time deadline) override {
    return core_->AllReduceSum(group, data, n, deadline);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllReduceSum(absl::Span<const int> group, float* data, size_t n,
                                                             absl::Time deadline) override {
    return core_->StartCollective(Core::Op::kAllReduce, group, data, n, {}, deadline);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartReduceScatterSum(absl::Span<const int> group, float* data,
                                                                 absl::Span<const size_t> counts,
                                                                 absl::Time deadline) override {
    return core_->StartCollective(Core::Op::kReduceScatter, group, data, 0, counts, deadline);
  }
  absl::StatusOr<std::unique_ptr<Request>> StartAllGather(absl::Span<const int> group, float* data,
                                                          absl::Span<const size_t> counts,
                                                          absl::Time deadline) override {
    return core_->StartCollective(Core::Op::kAllGather, group, data, 0, counts, deadline);
  }
  bool overlaps_collectives() const override { return true; }
  void Abort() override { core_->Abort("Abort() called"); }

 private:
  const std::shared_ptr<Core> core_;
};

// The device starts its event-loop thread, which inherits the scheduling
// policy and nice value of the thread that creates it (Linux keeps both per
// thread): a short-lived thread set to them creates it, so the caller's
// priority is never touched. Throws what CreateDevice throws.
std::shared_ptr<gloo::transport::Device> CreateDeviceWithLoopPriority(const gloo::transport::tcp::attr& attr,
                                                                      bool idle, int nice) {
  if (!idle && nice == 0) return gloo::transport::tcp::CreateDevice(attr);
  std::shared_ptr<gloo::transport::Device> device;
  std::exception_ptr error;
  std::thread([&] {
    const sched_param param{};
    if (idle && sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
      spdlog::warn("gloo: cannot run the event loop under SCHED_IDLE ({}); using nice {}", std::strerror(errno),
                   nice);
      idle = false;
    }
    if (!idle && nice != 0 && setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice) != 0) {
      spdlog::warn("gloo: cannot lower the event loop's priority to nice {}: {}", nice,
                   std::strerror(errno));
    }
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
  return device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     KeyValueStore* store) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.size: ", options.size, " is not positive"));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.rank: ", options.rank, " is not in [0, ", options.size, ")"));
  }
  if (options.job_prefix.empty()) return absl::InvalidArgumentError("options.job_prefix: empty");
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.connect_timeout: not positive");
  }
  if (store == nullptr) return absl::InvalidArgumentError("store: null");
  if (options.event_loop_nice < 0 || options.event_loop_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.event_loop_nice: ", options.event_loop_nice, " is not in [0, 19]"));
  }

  const absl::Time start = absl::Now();
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status status = CatchGloo("creating the TCP device", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.interface_address;
    device = CreateDeviceWithLoopPriority(attr, options.event_loop_idle, options.event_loop_nice);
  });
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.interface_address: cannot listen on '",
                                                   options.interface_address,
                                                   "': ", status.message()));
  }
  auto world = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  const absl::Time deadline = start + options.connect_timeout;
  status =
      ConnectMesh(*world, device, store, absl::StrCat(options.job_prefix, "/world/"), deadline);
  if (!status.ok()) {
    return Annotate(status, absl::StrCat("rank ", options.rank, " of ", options.size,
                                         " joining job '", options.job_prefix, "'"));
  }
  spdlog::info("rank {} of {}: gloo communicator for job '{}' connected on {} in {}", options.rank,
               options.size, options.job_prefix, device->str(),
               absl::FormatDuration(absl::Now() - start));
  return std::unique_ptr<Communicator>(new GlooCommunicator(
      std::make_shared<Core>(options, store, std::move(device), std::move(world))));
}

}  // namespace dynapipe::runtime::comm
