#include "src/safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "src/common/file_util.h"
#include "src/common/json_writer.h"
#include "src/safetensors/header_json.h"

namespace dynapipe::safetensors {

namespace {

using internal::Json;

constexpr DType kAll[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64,
                          DType::kI32, DType::kI16, DType::kI8,  DType::kU8,   DType::kBool};
constexpr char kMetadata[] = "__metadata__";
absl::StatusOr<DType> ParseDType(absl::string_view s) {
  for (DType d : kAll) {
    if (DTypeName(d) == s) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", s, "\""));
}

// elements * bytes, or an error when it does not fit 63 bits.
absl::StatusOr<uint64_t> ByteSize(std::span<const int64_t> shape, size_t bytes) {
  unsigned __int128 n = bytes;
  for (int64_t d : shape) {
    n *= static_cast<uint64_t>(d);
    if (n > static_cast<unsigned __int128>(INT64_MAX)) return absl::InvalidArgumentError("shape too large");
  }
  return static_cast<uint64_t>(n);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

absl::StatusOr<std::string> ReadAt(const std::string& path, uint64_t offset, uint64_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  std::string out(n, '\0');
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out.data() + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": short read at byte ", offset + done,
                                              got < 0 ? absl::StrCat(": ", std::strerror(err)) : ""));
    }
    done += static_cast<uint64_t>(got);
  }
  ::close(fd);
  return out;
}

}  // namespace

absl::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

size_t DTypeBytes(DType d) {
  switch (d) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 1;
}

int64_t TensorInfo::elements() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}

namespace {

// One tensor's header entry, checked against the data's size.
absl::StatusOr<TensorInfo> ParseTensor(const std::string& key, const Json& value, uint64_t data_bytes,
                                       const Limits& limits) {
  auto bad = [&key](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", key, "\": ", what));
  };
  if (value.kind != Json::kObject) return bad("not an object");
  TensorInfo t;
  t.name = key;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (size_t f = 0; f < value.keys.size(); ++f) {
    const std::string& field = value.keys[f];
    const Json& v = value.values[f];
    if (field == "dtype") {
      if (v.kind != Json::kString) return bad("dtype is not a string");
      absl::StatusOr<DType> d = ParseDType(v.str);
      if (!d.ok()) return bad(d.status().message());
      t.dtype = *d;
      has_dtype = true;
    } else if (field == "shape") {
      if (v.kind != Json::kArray) return bad("shape is not an array");
      if (static_cast<int>(v.values.size()) > limits.max_rank) {
        return bad(absl::StrCat("rank ", v.values.size(), " above ", limits.max_rank));
      }
      for (const Json& dim : v.values) {
        if (dim.kind != Json::kNumber || dim.num > static_cast<uint64_t>(INT64_MAX)) {
          return bad("shape holds something other than a dimension");
        }
        t.shape.push_back(static_cast<int64_t>(dim.num));
      }
      has_shape = true;
    } else if (field == "data_offsets") {
      if (v.kind != Json::kArray || v.values.size() != 2 || v.values[0].kind != Json::kNumber ||
          v.values[1].kind != Json::kNumber) {
        return bad("data_offsets is not [begin, end]");
      }
      t.begin = v.values[0].num;
      t.end = v.values[1].num;
      has_offsets = true;
    } else {
      return bad(absl::StrCat("unknown field \"", field, "\""));
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) return bad("needs dtype, shape and data_offsets");
  if (t.begin > t.end || t.end > data_bytes) {
    return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, ") outside the ", data_bytes, " data bytes"));
  }
  absl::StatusOr<uint64_t> size = ByteSize(t.shape, DTypeBytes(t.dtype));
  if (!size.ok()) return bad(size.status().message());
  if (*size != t.end - t.begin) {
    return bad(absl::StrCat("shape and dtype make ", *size, " bytes, data_offsets ", t.end - t.begin));
  }
  return t;
}

// The ranges tile the data: no overlap, no hole.
absl::Status CheckTiling(const std::vector<TensorInfo>& tensors, uint64_t data_bytes) {
  std::vector<const TensorInfo*> by_begin;
  for (const TensorInfo& t : tensors) by_begin.push_back(&t);
  std::stable_sort(by_begin.begin(), by_begin.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const TensorInfo* t : by_begin) {
    if (t->begin < at) return absl::InvalidArgumentError(absl::StrCat("tensor \"", t->name, "\" overlaps another"));
    if (t->begin > at) {
      return absl::InvalidArgumentError(absl::StrCat("a hole in the data before tensor \"", t->name, "\" (bytes ",
                                                     at, " to ", t->begin, ")"));
    }
    at = t->end;
  }
  if (at != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the data's last ", data_bytes - at, " bytes belong to no tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Reader::ParseHeader(absl::string_view header, uint64_t data_bytes, const Limits& limits) {
  absl::StatusOr<Json> doc = internal::ParseJson(header);
  if (!doc.ok()) return doc.status();
  if (doc->kind != Json::kObject) return absl::InvalidArgumentError("the header is not a JSON object");
  if (doc->keys.size() > limits.max_tensors + 1) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", limits.max_tensors, " tensors"));
  }
  for (size_t e = 0; e < doc->keys.size(); ++e) {
    const std::string& key = doc->keys[e];
    const Json& value = doc->values[e];
    if (key != kMetadata) {
      absl::StatusOr<TensorInfo> t = ParseTensor(key, value, data_bytes, limits);
      if (!t.ok()) return t.status();
      tensors_.push_back(std::move(*t));
      continue;
    }
    if (value.kind != Json::kObject) return absl::InvalidArgumentError("__metadata__ is not an object");
    for (size_t m = 0; m < value.keys.size(); ++m) {
      if (value.values[m].kind != Json::kString) {
        return absl::InvalidArgumentError(absl::StrCat("__metadata__.", value.keys[m], ": not a string"));
      }
      metadata_[value.keys[m]] = value.values[m].str;
    }
  }
  return CheckTiling(tensors_, data_bytes);
}

namespace {

// The header's length from the first 8 bytes, checked against the file.
absl::StatusOr<uint64_t> HeaderLength(absl::string_view first8, uint64_t file_bytes, const Limits& limits) {
  if (file_bytes < 8) {
    return absl::InvalidArgumentError(absl::StrCat("too short for a header length (", file_bytes, " bytes)"));
  }
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<unsigned char>(first8[k]);
  if (n < 2) return absl::InvalidArgumentError(absl::StrCat("header length ", n, " is too small"));
  if (n > limits.max_header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", n, " above the limit of ", limits.max_header_bytes));
  }
  if (n > file_bytes - 8) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", n, " runs past the file (", file_bytes, " bytes)"));
  }
  return n;
}

absl::Status Named(const std::string& name, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
}

}  // namespace

absl::StatusOr<Reader> Reader::FromBytes(absl::string_view bytes, std::string name, const Limits& limits) {
  Reader r;
  r.name_ = std::move(name);
  absl::StatusOr<uint64_t> n = HeaderLength(bytes.substr(0, 8), bytes.size(), limits);
  if (!n.ok()) return Named(r.name_, n.status());
  r.data_offset_ = 8 + *n;
  if (absl::Status s = r.ParseHeader(bytes.substr(8, *n), bytes.size() - r.data_offset_, limits); !s.ok()) {
    return Named(r.name_, s);
  }
  r.bytes_ = std::make_shared<const std::string>(bytes);
  return r;
}

absl::StatusOr<Reader> Reader::Open(const std::string& path, const Limits& limits) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  Reader r;
  r.name_ = path;
  r.path_ = path;
  absl::StatusOr<std::string> first = ReadAt(path, 0, std::min<uint64_t>(8, file_bytes));
  if (!first.ok()) return first.status();
  absl::StatusOr<uint64_t> n = HeaderLength(*first, file_bytes, limits);
  if (!n.ok()) return Named(path, n.status());
  absl::StatusOr<std::string> header = ReadAt(path, 8, *n);
  if (!header.ok()) return header.status();
  r.data_offset_ = 8 + *n;
  if (absl::Status s = r.ParseHeader(*header, file_bytes - r.data_offset_, limits); !s.ok()) return Named(path, s);
  return r;
}

const TensorInfo* Reader::Find(absl::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::string> Reader::ReadBytes(const TensorInfo& t) const {
  if (bytes_ != nullptr) return bytes_->substr(data_offset_ + t.begin, t.end - t.begin);
  return ReadAt(path_, data_offset_ + t.begin, t.end - t.begin);
}

absl::StatusOr<std::vector<float>> Reader::ReadF32(absl::string_view name) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat(name_, ": no tensor \"", name, "\""));
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16 && t->dtype != DType::kF64) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": tensor \"", name, "\" is ", DTypeName(t->dtype), ", not a floating-point type"));
  }
  absl::StatusOr<std::string> raw = ReadBytes(*t);
  if (!raw.ok()) return raw.status();
  const int64_t n = t->elements();
  std::vector<float> out(static_cast<size_t>(n));
  const char* p = raw->data();
  for (int64_t i = 0; i < n; ++i) {
    switch (t->dtype) {
      case DType::kF32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case DType::kF64: {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
        break;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = HalfToFloat(h);
        break;
      }
      default: {  // BF16: the high half of a float32
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
    }
  }
  return out;
}

namespace {

// The length prefix and the header (padded with spaces to 8 bytes) for
// `tensors` laid out back to back in order.
absl::StatusOr<std::string> Prefix(std::span<const TensorOut> tensors,
                                   const std::map<std::string, std::string>& metadata) {
  JsonWriter w;
  w.BeginObject();
  if (!metadata.empty()) {
    w.Key(kMetadata).BeginObject();
    for (const auto& [k, v] : metadata) w.Str(k, v);
    w.EndObject();
  }
  std::set<std::string> names;
  uint64_t at = 0;
  for (const TensorOut& t : tensors) {
    if (t.name == kMetadata || t.name.empty() || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name \"", t.name, "\" is empty, reserved or repeated"));
    }
    absl::StatusOr<uint64_t> size = ByteSize(t.shape, DTypeBytes(t.dtype));
    if (!size.ok() || *size != t.bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor \"", t.name, "\": ", t.bytes.size(), " bytes do not match its shape"));
    }
    w.Key(t.name).BeginObject().Str("dtype", std::string(DTypeName(t.dtype))).Key("shape").BeginArray();
    for (int64_t d : t.shape) w.Int(d);
    w.EndArray().Key("data_offsets").BeginArray().Int(static_cast<int64_t>(at)).Int(static_cast<int64_t>(at + *size));
    w.EndArray().EndObject();
    at += *size;
  }
  w.EndObject();
  std::string header = w.Take();
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int k = 0; k < 8; ++k, n >>= 8) out[k] = static_cast<char>(n & 0xFF);
  return out + header;
}

}  // namespace

absl::StatusOr<std::string> Serialize(std::span<const TensorOut> tensors,
                                      const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> out = Prefix(tensors, metadata);
  if (!out.ok()) return out.status();
  for (const TensorOut& t : tensors) out->append(t.bytes.data(), t.bytes.size());
  return out;
}

absl::Status Write(const std::string& path, std::span<const TensorOut> tensors,
                   const std::map<std::string, std::string>& metadata) {
  // Streamed: a model's tensors are not copied into one buffer.
  absl::StatusOr<std::string> prefix = Prefix(tensors, metadata);
  if (!prefix.ok()) return prefix.status();
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> w = AtomicFileWriter::Create(path);
  if (!w.ok()) return w.status();
  if (absl::Status s = (*w)->Append(*prefix); !s.ok()) return s;
  for (const TensorOut& t : tensors) {
    if (absl::Status s = (*w)->Append(absl::string_view(t.bytes.data(), t.bytes.size())); !s.ok()) return s;
  }
  return (*w)->Commit();
}

absl::StatusOr<std::map<std::string, std::string>> ParseWeightMapJson(absl::string_view index_json) {
  absl::StatusOr<Json> doc = internal::ParseJson(index_json);
  if (!doc.ok()) return doc.status();
  if (doc->kind != Json::kObject) return absl::InvalidArgumentError("the index is not a JSON object");
  std::map<std::string, std::string> out;
  bool found = false;
  for (size_t i = 0; i < doc->keys.size(); ++i) {
    if (doc->keys[i] != "weight_map") continue;
    found = true;
    const Json& m = doc->values[i];
    if (m.kind != Json::kObject) return absl::InvalidArgumentError("weight_map is not an object");
    for (size_t k = 0; k < m.keys.size(); ++k) {
      if (m.values[k].kind != Json::kString) {
        return absl::InvalidArgumentError(absl::StrCat("weight_map.", m.keys[k], ": not a file name"));
      }
      out[m.keys[k]] = m.values[k].str;
    }
  }
  if (!found) return absl::InvalidArgumentError("the index has no weight_map");
  return out;
}

TensorOut F32Tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data) {
  return TensorOut{std::move(name), DType::kF32, std::move(shape),
                   std::span<const char>(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float))};
}

}  // namespace dynapipe::safetensors
