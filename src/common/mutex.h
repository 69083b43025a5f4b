#pragma once

// The project's mutex: absl::Mutex's interface (Lock/Unlock/Await, MutexLock,
// thread-safety annotations) over std::mutex and std::condition_variable.
//
// Why not absl::Mutex itself: the distribution's Abseil is not built with
// ThreadSanitizer, so the ordering absl::Mutex establishes is invisible to
// --config=tsan and every guarded access would be reported as a race. std::mutex
// goes through pthreads, which TSan understands.

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace dynapipe {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Wakes waiters so they re-check their conditions, then unlocks.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (waiters_ > 0) cv_.notify_all();
    mu_.unlock();
  }

  // Blocks until `cond()` is true; the mutex is held on entry and on return.
  template <typename Cond>
  void Await(Cond cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    ++waiters_;
    cv_.wait(lock, cond);
    --waiters_;
    lock.release();
  }

  // Like Await but gives up at `deadline`; returns the final value of cond().
  template <typename Cond>
  bool AwaitWithDeadline(Cond cond, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    ++waiters_;
    const bool ok = cv_.wait_until(lock, absl::ToChronoTime(deadline), cond);
    --waiters_;
    lock.release();
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;  // guarded by mu_
};

// Holds a Mutex for the enclosing scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace dynapipe
