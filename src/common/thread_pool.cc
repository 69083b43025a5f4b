#include "src/common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace dynapipe {

ThreadPool::ThreadPool(int num_threads) {
  const int n = std::max(1, num_threads);
  workers_.reserve(n);
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

bool ThreadPool::TrySchedule(std::function<void()> task, size_t max_queued) {
  MutexLock lock(&mu_);
  if (queue_.size() - head_ >= max_queued) return false;
  queue_.push_back(std::move(task));
  return true;
}

size_t ThreadPool::queued() {
  MutexLock lock(&mu_);
  return queue_.size() - head_;
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || head_ < queue_.size(); });
      if (head_ == queue_.size()) return;  // stopping and drained
      task = std::move(queue_[head_++]);
      if (head_ == queue_.size()) {
        queue_.clear();
        head_ = 0;
      }
    }
    task();
  }
}

void ThreadPool::ParallelFor(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  std::atomic<int> next{0};
  struct Done {
    Mutex mu;
    int count = 0;
    int want = 0;
  } done;
  auto drain = [&] {
    for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  const int helpers = std::min(size(), n - 1);
  done.want = helpers;
  for (int h = 0; h < helpers; ++h) {
    Schedule([&] {
      drain();
      MutexLock lock(&done.mu);
      ++done.count;
    });
  }
  drain();
  MutexLock lock(&done.mu);
  done.mu.Await([&done]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done.count == done.want; });
}

}  // namespace dynapipe
