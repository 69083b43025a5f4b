#pragma once

// Checkpoints of one rank's worker, through the stage seam: restore imports
// every chunk's parameters and AdamW moments from the rank's shard; save
// exports them to host memory (the device -> host copies, on the critical
// path) and writes the shard on a background thread while training goes on.
// A shard counts as written only once it is on disk: then the writer thread
// calls the caller's `written` callback (the executor reports the shard to
// the planner from there).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "src/checkpoint/checkpoint.h"
#include "runtime/executor/worker.h"

namespace dynapipe::runtime::executor {

class Checkpointer {
 public:
  // Shards of the rank `info` describes, under `dir`. Once `cancelled` (may
  // be empty) is true, a write in flight stops and its shard is discarded
  // (checkpoint::WriteShard): the previous complete checkpoint stays the
  // latest, never a torn one.
  Checkpointer(std::string dir, checkpoint::ShardInfo info, std::function<bool()> cancelled = {});
  // Waits for a write in flight.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Loads the shard of `iteration` (the last completed one) into `worker`:
  // NOT_FOUND / DATA_LOSS from the shard, FAILED_PRECONDITION when it belongs
  // to another job layout or rank, DATA_LOSS when a tensor is missing or has
  // another size.
  absl::Status Restore(int64_t iteration, Worker& worker);
  // Exports `worker`'s state after `iteration` and starts writing its shard;
  // first waits for the previous write (its error is returned here).
  // `written` (may be empty) runs on the writer thread once the shard is on
  // disk.
  absl::Status Begin(int64_t iteration, Worker& worker, std::function<void()> written = {});
  // Waits for the write in flight; OK when none.
  absl::Status Wait();

 private:
  struct Write;
  std::string dir_;
  checkpoint::ShardInfo info_;
  std::function<bool()> cancelled_;
  std::unique_ptr<Write> write_;
  std::thread thread_;
};

}  // namespace dynapipe::runtime::executor
