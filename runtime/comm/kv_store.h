#pragma once

// The in-memory rendezvous store: for tests and for ranks that are threads of
// one process.

#include <string>

#include "absl/container/flat_hash_map.h"
#include "runtime/comm/comm.h"
#include "src/common/mutex.h"

namespace dynapipe::runtime::comm {

class MemoryKeyValueStore final : public KeyValueStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration wait) override;

 private:
  Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::runtime::comm
