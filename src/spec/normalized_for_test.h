#pragma once

// Test support: a spec the test builds by hand, normalised where tests enter
// it (as Submit or a spec file would); the test fails if it is not valid.

#include "src/spec/job_spec.h"
#include "src/testing/status_require.h"

namespace dynapipe::spec {

inline NormalizedJobSpec NormalizedForTest(const proto::JobSpec& spec) {
  absl::StatusOr<NormalizedJobSpec> n = NormalizedJobSpec::Normalize(spec);
  REQUIRE_OK(n.status());
  return *std::move(n);
}

}  // namespace dynapipe::spec
