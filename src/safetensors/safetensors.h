#pragma once

// Hugging Face's safetensors format, read and written by our own small,
// bounded code: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and [begin, end) byte range in the data that
// follows (plus an optional "__metadata__" object of strings), then the raw
// little-endian tensors back to back.
//
// Reading trusts nothing: the header's length against the file and a limit,
// the JSON (a strict parser for exactly this header: objects, arrays,
// strings, non-negative integers; no duplicate keys, bounded depth), each
// dtype, each shape against its byte range, every range inside the data,
// and the ranges tiling the data with neither overlaps nor holes (as the
// format requires). Every refusal is one line naming the file and what was
// wrong (INVALID_ARGUMENT, or NOT_FOUND / DATA_LOSS for I/O). Writing is
// atomic (a temporary file renamed into place).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynapipe::safetensors {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", ... as the header spells them.
absl::string_view DTypeName(DType d);
size_t DTypeBytes(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  int64_t elements() const;
};

struct Limits {
  uint64_t max_header_bytes = uint64_t{100} << 20;  // the reference reader's bound
  size_t max_tensors = size_t{1} << 20;
  int max_rank = 8;
};

// A parsed and validated file; tensor data is read on demand.
class Reader {
 public:
  // Reads and checks the header of `path` (the data stays on disk).
  static absl::StatusOr<Reader> Open(const std::string& path, const Limits& limits = {});
  // The same over a whole file already in memory (tests, fuzzing); `name`
  // is what errors call it. The bytes are copied.
  static absl::StatusOr<Reader> FromBytes(absl::string_view bytes, std::string name = "safetensors",
                                          const Limits& limits = {});

  // In header order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(absl::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's elements widened to float32 (F32, F16, BF16 and F64
  // tensors; INVALID_ARGUMENT for the others or a missing name).
  absl::StatusOr<std::vector<float>> ReadF32(absl::string_view name) const;
  // Its raw little-endian bytes.
  absl::StatusOr<std::string> ReadBytes(const TensorInfo& t) const;

 private:
  Reader() = default;
  absl::Status ParseHeader(absl::string_view header, uint64_t data_bytes, const Limits& limits);

  std::string name_;            // the path, or the caller's name
  std::string path_;            // empty: in memory
  std::shared_ptr<const std::string> bytes_;  // the whole file when in memory
  uint64_t data_offset_ = 0;    // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: its little-endian bytes (not copied).
struct TensorOut {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const char> bytes;
};

// The whole file as bytes: tensors in the given order, header padded with
// spaces to a multiple of 8 bytes. INVALID_ARGUMENT for a duplicate or
// reserved name, or bytes that do not match a shape.
absl::StatusOr<std::string> Serialize(std::span<const TensorOut> tensors,
                                      const std::map<std::string, std::string>& metadata = {});
// Serialize, written atomically to `path`.
absl::Status Write(const std::string& path, std::span<const TensorOut> tensors,
                   const std::map<std::string, std::string>& metadata = {});

// The "weight_map" object of a sharded model's index JSON (see
// weight_set.h), by the header's strict parser.
absl::StatusOr<std::map<std::string, std::string>> ParseWeightMapJson(absl::string_view index_json);

// A float32 tensor's TensorOut over `data` (which must outlive it).
TensorOut F32Tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data);

}  // namespace dynapipe::safetensors
