#pragma once

// Answers a call within a time budget although the work behind it may stall:
// `primary` (say, reads from Redis) runs on a worker pool; if it has not
// answered when the budget is spent, or fails UNAVAILABLE, or the pool
// already holds too many waiting tasks, `fallback` (say, the last known
// state, from memory) answers instead. `done` runs exactly once, on a pool
// worker, the timer's thread or the caller's; a primary that loses the race
// still runs to its end (its result is dropped), so it must own what it
// reads (copies, not references into the call).

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "src/common/mutex.h"
#include "src/common/thread_pool.h"
#include "src/common/timer_thread.h"

namespace dynapipe {

struct AnswerWithinOptions {
  ThreadPool* pool = nullptr;
  TimerThread* timers = nullptr;
  absl::Duration budget = absl::Milliseconds(150);
  size_t max_queued = 1024;  // pool tasks waiting beyond which the fallback answers at once
};

template <typename T>
void AnswerWithin(const AnswerWithinOptions& o, std::function<absl::StatusOr<T>()> primary,
                  std::function<absl::StatusOr<T>(const absl::Status& why)> fallback,
                  std::function<void(absl::StatusOr<T>)> done) {
  struct State {
    Mutex mu;
    bool answered ABSL_GUARDED_BY(mu) = false;
    std::function<absl::StatusOr<T>(const absl::Status&)> fallback;
    std::function<void(absl::StatusOr<T>)> done;
    // True for the first caller only.
    bool Claim() {
      MutexLock lock(&mu);
      if (answered) return false;
      answered = true;
      return true;
    }
  };
  auto state = std::make_shared<State>();
  state->fallback = std::move(fallback);
  state->done = std::move(done);
  const absl::Duration budget = o.budget;
  const bool queued = o.pool->TrySchedule(
      [state, primary = std::move(primary)] {
        absl::StatusOr<T> r = primary();
        if (!state->Claim()) return;
        if (r.status().code() == absl::StatusCode::kUnavailable) r = state->fallback(r.status());
        state->done(std::move(r));
      },
      o.max_queued);
  if (!queued) {
    if (state->Claim()) {
      state->done(state->fallback(absl::ResourceExhaustedError(
          absl::StrCat(o.max_queued, " calls already wait for workers held up by the store"))));
    }
    return;
  }
  o.timers->After(budget, [state, budget] {
    if (!state->Claim()) return;
    state->done(state->fallback(
        absl::DeadlineExceededError(absl::StrCat("no answer within ", absl::FormatDuration(budget)))));
  });
}

// The same, waiting for the answer (at most about the budget).
template <typename T>
absl::StatusOr<T> AnswerWithinSync(const AnswerWithinOptions& o, std::function<absl::StatusOr<T>()> primary,
                                   std::function<absl::StatusOr<T>(const absl::Status& why)> fallback) {
  struct Slot {
    Mutex mu;
    std::optional<absl::StatusOr<T>> result ABSL_GUARDED_BY(mu);
  };
  auto slot = std::make_shared<Slot>();
  AnswerWithin<T>(o, std::move(primary), std::move(fallback), [slot](absl::StatusOr<T> r) {
    MutexLock lock(&slot->mu);
    slot->result = std::move(r);
  });
  MutexLock lock(&slot->mu);
  slot->mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return slot->result.has_value(); });
  return std::move(*slot->result);
}

}  // namespace dynapipe
