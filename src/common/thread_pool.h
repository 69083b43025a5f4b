#pragma once

// A fixed-size pool of worker threads with a FIFO queue.

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "src/common/mutex.h"

namespace dynapipe {

class ThreadPool {
 public:
  // Starts `num_threads` workers (at least one).
  explicit ThreadPool(int num_threads);
  // Runs every queued task, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; it runs on some worker.
  void Schedule(std::function<void()> task);
  // Queues `task` unless `max_queued` tasks already wait for a worker; false
  // (and `task` dropped) then. For work that must be refused, not delayed
  // without bound, when the workers are held up.
  bool TrySchedule(std::function<void()> task, size_t max_queued);
  // Tasks waiting for a worker.
  size_t queued();

  // Runs fn(i) for i in [0, n) on the workers and the calling thread; returns
  // when all are done. Must not be called from a worker of this pool.
  void ParallelFor(int n, const std::function<void(int)>& fn);

  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();

  Mutex mu_;
  std::vector<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);  // FIFO via head_
  size_t head_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace dynapipe
