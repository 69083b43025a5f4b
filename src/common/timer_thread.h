#pragma once

// One thread that runs callbacks when they fall due: for deadlines of
// asynchronous work (answer from elsewhere if the work has not answered by
// then). Callbacks run one at a time on the timer's thread and must be short.

#include <functional>
#include <map>
#include <thread>

#include "absl/time/time.h"
#include "src/common/mutex.h"

namespace dynapipe {

class TimerThread {
 public:
  TimerThread();
  // Runs the callbacks still pending at once (whoever waits on them is not
  // left waiting), then joins the thread.
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  // Runs `fn` on the timer's thread `delay` from now (at once if not
  // positive), or at destruction, whichever comes first.
  void After(absl::Duration delay, std::function<void()> fn);

 private:
  void Loop();

  Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> due_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dynapipe
