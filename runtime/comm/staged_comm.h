#pragma once

// A Communicator for device buffers over a host one (Gloo): every transfer
// and all-reduce goes through host memory. The CUDA backend uses it to run
// several ranks on one GPU, or across hosts without NCCL; the data path is
// the same as the host communicator's, plus one copy each way.
//
// - Send copies the device bytes to a host staging buffer when it starts
//   (ordered after the work queued on the device so far, complete on return)
//   and sends from there: the device buffer may be reused at once.
// - Recv receives into a host staging buffer; Wait copies it to the device
//   once the transfer completed.
// - AllReduceSum copies to the host, reduces there and copies back.
// Deadlines, aborts and lost-peer errors are the host communicator's.

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "runtime/comm/comm.h"

namespace dynapipe::runtime::comm {

struct StagingCopies {
  // Complete on return.
  std::function<absl::Status(void* host, const void* device, size_t bytes)> to_host;
  std::function<absl::Status(void* device, const void* host, size_t bytes)> from_host;
};

std::unique_ptr<Communicator> HostStaged(std::unique_ptr<Communicator> host, StagingCopies copies);

}  // namespace dynapipe::runtime::comm
