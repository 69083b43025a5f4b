#include "runtime/comm/kv_store.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dynapipe::runtime::comm {

absl::Status MemoryKeyValueStore::Set(absl::string_view key, absl::string_view value) {
  MutexLock lock(&mu_);
  values_[key] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryKeyValueStore::Get(absl::string_view key, absl::Duration wait) {
  MutexLock lock(&mu_);
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
  if (wait == absl::InfiniteDuration()) {
    // An infinite deadline would overflow the condition variable's clock.
    mu_.Await(present);
  } else if (!mu_.AwaitWithDeadline(present, absl::Now() + wait)) {
    return absl::DeadlineExceededError(
        absl::StrCat("key '", key, "' was not set within ", absl::FormatDuration(wait)));
  }
  return values_.find(key)->second;
}

}  // namespace dynapipe::runtime::comm
