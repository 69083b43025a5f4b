#pragma once

// Gloo at our boundary: its exceptions become statuses, our deadlines its
// relative timeouts, and its rendezvous runs over our KeyValueStore. Internal
// to the Gloo backend.

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/device.h"
#include "runtime/comm/comm.h"

namespace dynapipe::runtime::comm::gloo_support {

// The timeout Gloo should wait for `deadline`: rounded up to whole
// milliseconds so we never give up early, never negative, and capped so that
// Gloo's condition_variable::wait_for cannot overflow the clock.
std::chrono::milliseconds TimeoutUntil(absl::Time deadline);

// Gloo's messages, on one line.
std::string OneLine(absl::string_view text);

// Carries a status through Gloo code (thrown by our rendezvous store).
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)) {}
  const char* what() const noexcept override { return "dynapipe status"; }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Runs `fn`; a StatusError comes back as its status, anything else Gloo throws
// (IoException for connection failures and timeouts, EnforceNotMet for broken
// preconditions) as UNAVAILABLE / INTERNAL prefixed with `what`.
template <typename Fn>
absl::Status CatchGloo(absl::string_view what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const StatusError& e) {
    return e.status();
  } catch (const gloo::IoException& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", OneLine(e.what())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", OneLine(e.what())));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

// Connects `context` (its rank and size set) to the other members: addresses
// are exchanged under `key_prefix` in `store`, and everything must be done by
// `deadline` (DEADLINE_EXCEEDED names the missing key). When `aborted` is set
// it is polled while waiting for keys; once true the result is ABORTED.
absl::Status ConnectMesh(gloo::rendezvous::Context& context,
                         std::shared_ptr<gloo::transport::Device> device, KeyValueStore* store,
                         absl::string_view key_prefix, absl::Time deadline,
                         std::function<bool()> aborted = nullptr);

}  // namespace dynapipe::runtime::comm::gloo_support
