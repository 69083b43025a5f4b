#include "src/common/timer_thread.h"

#include <utility>

#include "absl/time/clock.h"

namespace dynapipe {

TimerThread::TimerThread() : thread_([this] { Loop(); }) {}

TimerThread::~TimerThread() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TimerThread::After(absl::Duration delay, std::function<void()> fn) {
  MutexLock lock(&mu_);
  due_.emplace(absl::Now() + delay, std::move(fn));
}

void TimerThread::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      MutexLock lock(&mu_);
      while (true) {
        if (due_.empty()) {
          if (stopping_) return;
          mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || !due_.empty(); });
          continue;
        }
        const absl::Time next = due_.begin()->first;
        if (stopping_ || absl::Now() >= next) break;
        // Wakes early for a sooner callback or for stopping.
        mu_.AwaitWithDeadline(
            [this, next]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || due_.begin()->first < next; }, next);
      }
      fn = std::move(due_.begin()->second);
      due_.erase(due_.begin());
    }
    fn();
  }
}

}  // namespace dynapipe
