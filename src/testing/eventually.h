#pragma once

// Polls a condition in tests: every 10 ms until it holds or `limit` passes.

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dynapipe::testing {

template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return pred();
}

}  // namespace dynapipe::testing
