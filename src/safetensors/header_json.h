#pragma once

// The strict JSON reader of safetensors headers and indexes (internal to
// this package): objects (keys in order, no duplicates), arrays, strings
// (escapes decoded to UTF-8) and non-negative integers, nested at most
// kMaxDepth deep; nothing else (no floats, booleans or null).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynapipe::safetensors::internal {

struct Json {
  enum Kind { kObject, kArray, kString, kNumber } kind = kNumber;
  std::string str;
  uint64_t num = 0;
  std::vector<std::string> keys;  // an object's keys, in order
  std::vector<Json> values;       // its values, or an array's items
};

// The whole of `text` as one JSON value; INVALID_ARGUMENT naming the byte.
absl::StatusOr<Json> ParseJson(absl::string_view text);

}  // namespace dynapipe::safetensors::internal
