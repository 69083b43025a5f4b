#include "runtime/comm/gloo_support.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gloo/rendezvous/store.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::comm::gloo_support {
namespace {

using Millis = std::chrono::milliseconds;

// How often a rendezvous that can be aborted looks up from the store.
constexpr absl::Duration kAbortPoll = absl::Milliseconds(100);
// Gloo caps its own waits at 100 hours for the same overflow reason.
constexpr absl::Duration kMaxTimeout = absl::Hours(100);

// Gloo's rendezvous store over our KeyValueStore, with every key under a
// prefix and one deadline for the whole rendezvous.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore* store, absl::string_view prefix, absl::Time deadline,
               std::function<bool()> aborted)
      : store_(store), prefix_(prefix), deadline_(deadline), aborted_(std::move(aborted)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const absl::Status status =
        store_->Set(prefix_ + key, absl::string_view(data.data(), data.size()));
    if (!status.ok()) throw StatusError(Annotate(status, "rendezvous"));
  }
  // connectFullMesh also calls get() without wait() first (for the "rank_N"
  // host-name keys it uses to compute local ranks), so get() waits as well.
  std::vector<char> get(const std::string& key) override {
    const std::string value = Fetch(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) Fetch(key);
  }
  // Gloo passes its context timeout here; our deadline covers the whole mesh.
  void wait(const std::vector<std::string>& keys, const Millis& /*timeout*/) override {
    wait(keys);
  }

 private:
  std::string Fetch(const std::string& key) {
    const std::string full_key = prefix_ + key;
    for (;;) {
      if (aborted_ && aborted_()) throw StatusError(absl::AbortedError("rendezvous aborted"));
      const absl::Duration left = deadline_ - absl::Now();
      if (left <= absl::ZeroDuration()) {
        throw StatusError(absl::DeadlineExceededError(absl::StrCat(
            "rendezvous key '", full_key, "' was not set in time (is every rank up?)")));
      }
      absl::StatusOr<std::string> value =
          store_->Get(full_key, aborted_ ? std::min(left, kAbortPoll) : left);
      if (value.ok()) return *std::move(value);
      if (!absl::IsDeadlineExceeded(value.status())) {
        throw StatusError(Annotate(value.status(), "rendezvous"));
      }
    }
  }

  KeyValueStore* const store_;
  const std::string prefix_;
  const absl::Time deadline_;
  const std::function<bool()> aborted_;  // may be empty
};

}  // namespace

Millis TimeoutUntil(absl::Time deadline) {
  const absl::Duration left = std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kMaxTimeout);
  return Millis(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
}

std::string OneLine(absl::string_view text) { return absl::StrReplaceAll(text, {{"\n", " "}}); }

absl::Status ConnectMesh(gloo::rendezvous::Context& context,
                         std::shared_ptr<gloo::transport::Device> device, KeyValueStore* store,
                         absl::string_view key_prefix, absl::Time deadline,
                         std::function<bool()> aborted) {
  StoreAdapter adapter(store, key_prefix, deadline, std::move(aborted));
  // The context timeout only bounds connecting here (we pass explicit
  // timeouts to every later wait), and Gloo allows each pair's TCP connect
  // five times it.
  context.setTimeout(std::max(Millis(1), TimeoutUntil(deadline) / 5));
  return CatchGloo("connecting", [&] { context.connectFullMesh(adapter, device); });
}

}  // namespace dynapipe::runtime::comm::gloo_support
