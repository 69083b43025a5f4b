#pragma once

// Whole-file reads and crash-safe writes.

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dynapipe {

// NOT_FOUND when the file does not exist; UNAVAILABLE for other I/O errors.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it
// over `path` and fsyncs the directory: readers see the old or the new file,
// never a torn one.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);

}  // namespace dynapipe
