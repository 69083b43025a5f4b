#include "src/safetensors/weight_set.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "src/common/file_util.h"

namespace dynapipe::safetensors {

namespace {

bool IsDir(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool Exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

// A small regular file's contents: a FIFO, a device or a huge file is
// refused before it is read (reading a FIFO would wait for a writer).
absl::StatusOr<std::string> ReadSmallFile(const std::string& p, uint64_t limit) {
  struct stat st{};
  if (::stat(p.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(p, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(p, ": not a regular file"));
  if (static_cast<uint64_t>(st.st_size) > limit) {
    return absl::InvalidArgumentError(absl::StrCat(p, ": larger than ", limit, " bytes"));
  }
  return ReadFile(p);
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseWeightMap(absl::string_view index_json) {
  return ParseWeightMapJson(index_json);
}

absl::StatusOr<WeightSet> WeightSet::Open(const std::string& path, const Limits& limits) {
  WeightSet w;
  if (!Exists(path)) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(ENOENT)));
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
  if (!IsDir(path)) {
    files.push_back(path);
  } else {
    const std::string index = path + "/model.safetensors.index.json";
    if (Exists(index)) {
      absl::StatusOr<std::string> text = ReadSmallFile(index, limits.max_header_bytes);
      if (!text.ok()) return text.status();
      absl::StatusOr<std::map<std::string, std::string>> m = ParseWeightMap(*text);
      if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(index, ": ", m.status().message()));
      weight_map = std::move(*m);
      std::map<std::string, bool> seen;
      for (const auto& [name, file] : weight_map) {
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
          return absl::InvalidArgumentError(absl::StrCat(index, ": tensor ", name, " names file \"", file,
                                                         "\" outside the folder"));
        }
        if (!seen[file]) files.push_back(path + "/" + file);
        seen[file] = true;
      }
    } else if (Exists(path + "/model.safetensors")) {
      files.push_back(path + "/model.safetensors");
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": holds neither model.safetensors nor model.safetensors.index.json"));
    }
    if (Exists(path + "/config.json")) {
      absl::StatusOr<std::string> config = ReadSmallFile(path + "/config.json", limits.max_header_bytes);
      if (!config.ok()) return config.status();
      w.config_json_ = std::move(*config);
    }
  }
  for (const std::string& f : files) {
    absl::StatusOr<Reader> r = Reader::Open(f, limits);
    if (!r.ok()) return r.status();
    w.readers_.push_back(std::make_unique<Reader>(std::move(*r)));
    const Reader* reader = w.readers_.back().get();
    for (const TensorInfo& t : reader->tensors()) {
      if (!w.where_.emplace(t.name, reader).second) {
        return absl::InvalidArgumentError(absl::StrCat(f, ": tensor ", t.name, " is in another file too"));
      }
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = w.where_.find(name);
    if (it == w.where_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, "/model.safetensors.index.json: tensor ", name, " is not in ", file));
    }
  }
  return w;
}

const TensorInfo* WeightSet::Find(absl::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second->Find(name);
}

absl::StatusOr<std::vector<float>> WeightSet::ReadF32(absl::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return absl::NotFoundError(absl::StrCat("no tensor ", name));
  return it->second->ReadF32(name);
}

}  // namespace dynapipe::safetensors
