#include "src/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "src/data/lengths.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "google/protobuf/text_format.h"

namespace dynapipe::data {
namespace {

static_assert(std::endian::native == std::endian::little, "the dataset format is little-endian");

constexpr char kTokMagic[8] = {'D', 'P', 'D', 'S', 'T', 'O', 'K', '1'};
constexpr char kIdxMagic[8] = {'D', 'P', 'D', 'S', 'I', 'D', 'X', '1'};
constexpr size_t kIdxHeader = 32;
constexpr size_t kRecord = 24;

struct Record {
  uint64_t offset;
  uint32_t input_len, target_len, task, reserved;
};
static_assert(sizeof(Record) == kRecord);

absl::Status WriteAll(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) return absl::UnavailableError(absl::StrCat("write ", path, " failed"));
  return absl::OkStatus();
}

absl::Status CloseSynced(std::FILE* f, const std::string& path) {
  const bool ok = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) return absl::UnavailableError(absl::StrCat("flush ", path, " failed"));
  return absl::OkStatus();
}

// Read-only memory map of a whole regular file. O_NONBLOCK: opening a FIFO
// must not wait for a writer (a FIFO, a device or a directory is refused).
absl::StatusOr<std::pair<const uint8_t*, size_t>> Map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t n = static_cast<size_t>(st.st_size);
  void* p = n > 0 ? ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  ::close(fd);
  if (n > 0 && p == MAP_FAILED) return absl::UnavailableError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  return std::make_pair(static_cast<const uint8_t*>(p), n);
}

}  // namespace

struct DatasetWriter::Files {
  std::FILE* tokens = nullptr;
  std::FILE* index = nullptr;
  std::string tokens_tmp, index_tmp;
  ~Files() {
    if (tokens != nullptr) std::fclose(tokens);
    if (index != nullptr) std::fclose(index);
  }
};

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(const std::string& dir, proto::DatasetInfo info) {
  if (info.vocab() == 0) return absl::InvalidArgumentError("dataset vocab must be positive");
  if (info.tasks_size() == 0) return absl::InvalidArgumentError("dataset needs at least one task");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("create ", dir, ": ", ec.message()));
  std::unique_ptr<DatasetWriter> w(new DatasetWriter());
  w->dir_ = dir;
  w->info_ = std::move(info);
  w->files_ = std::make_unique<Files>();
  w->files_->tokens_tmp = dir + "/tokens.bin.tmp";
  w->files_->index_tmp = dir + "/index.bin.tmp";
  w->files_->tokens = std::fopen(w->files_->tokens_tmp.c_str(), "wb");
  w->files_->index = std::fopen(w->files_->index_tmp.c_str(), "wb");
  if (w->files_->tokens == nullptr || w->files_->index == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot write in ", dir));
  }
  RETURN_IF_ERROR(WriteAll(w->files_->tokens, kTokMagic, sizeof(kTokMagic), w->files_->tokens_tmp));
  const uint8_t zeros[kIdxHeader] = {};
  RETURN_IF_ERROR(WriteAll(w->files_->index, zeros, kIdxHeader, w->files_->index_tmp));  // header written at Finish
  return w;
}

DatasetWriter::~DatasetWriter() = default;

absl::Status DatasetWriter::Add(std::span<const uint32_t> input, std::span<const uint32_t> target, uint32_t task) {
  if (files_ == nullptr) return absl::FailedPreconditionError("dataset writer already finished");
  if (input.empty()) return absl::InvalidArgumentError(absl::StrCat("sample ", samples_, ": empty input"));
  if (task >= static_cast<uint32_t>(info_.tasks_size())) {
    return absl::InvalidArgumentError(absl::StrCat("sample ", samples_, ": task ", task, " unknown"));
  }
  for (auto part : {input, target}) {
    for (uint32_t id : part) {
      if (id >= info_.vocab()) {
        return absl::InvalidArgumentError(absl::StrCat("sample ", samples_, ": token ", id, " outside vocab ", info_.vocab()));
      }
    }
  }
  const Record r{tokens_, static_cast<uint32_t>(input.size()), static_cast<uint32_t>(target.size()), task, 0};
  RETURN_IF_ERROR(WriteAll(files_->tokens, input.data(), input.size_bytes(), files_->tokens_tmp));
  RETURN_IF_ERROR(WriteAll(files_->tokens, target.data(), target.size_bytes(), files_->tokens_tmp));
  RETURN_IF_ERROR(WriteAll(files_->index, &r, sizeof(r), files_->index_tmp));
  tokens_ += input.size() + target.size();
  ++samples_;
  return absl::OkStatus();
}

absl::Status DatasetWriter::Finish() {
  if (files_ == nullptr) return absl::FailedPreconditionError("dataset writer already finished");
  uint8_t header[kIdxHeader] = {};
  std::memcpy(header, kIdxMagic, 8);
  const uint32_t version = kFormatVersion;
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 16, &samples_, 8);
  std::memcpy(header + 24, &tokens_, 8);
  if (std::fseek(files_->index, 0, SEEK_SET) != 0) return absl::UnavailableError("seek index");
  RETURN_IF_ERROR(WriteAll(files_->index, header, kIdxHeader, files_->index_tmp));
  std::FILE* t = files_->tokens;
  std::FILE* i = files_->index;
  files_->tokens = files_->index = nullptr;
  RETURN_IF_ERROR(CloseSynced(t, files_->tokens_tmp));
  RETURN_IF_ERROR(CloseSynced(i, files_->index_tmp));
  for (const auto& [from, to] : {std::pair{files_->tokens_tmp, dir_ + "/tokens.bin"}, {files_->index_tmp, dir_ + "/index.bin"}}) {
    if (std::rename(from.c_str(), to.c_str()) != 0) return absl::UnavailableError(absl::StrCat("rename to ", to));
  }
  info_.set_format_version(kFormatVersion);
  info_.set_num_samples(samples_);
  info_.set_num_tokens(tokens_);
  files_.reset();
  std::string text;
  google::protobuf::TextFormat::PrintToString(info_, &text);
  return WriteFileAtomic(dir_ + "/dataset.pbtxt", text);
}

absl::Status CheckDatasetConfined(const std::string& data_root, const std::string& dir) {
  for (const char* file : kDatasetFiles) RETURN_IF_ERROR(ConfinedPath(data_root, absl::StrCat(dir, "/", file)).status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& dir) {
  std::unique_ptr<Dataset> d(new Dataset());
  RETURN_IF_ERROR(LoadProtoFileQuietly(dir + "/dataset.pbtxt", &d->info_));
  ASSIGN_OR_RETURN(auto idx, Map(dir + "/index.bin"));
  d->index_ = idx.first;
  d->index_bytes_ = idx.second;
  ASSIGN_OR_RETURN(auto tok, Map(dir + "/tokens.bin"));
  d->tokens_ = reinterpret_cast<const uint32_t*>(tok.first + (tok.first ? sizeof(kTokMagic) : 0));
  d->token_bytes_ = tok.second;
  auto corrupt = [&](const std::string& why) { return absl::DataLossError(absl::StrCat("dataset ", dir, ": ", why)); };
  if (d->index_bytes_ < kIdxHeader || std::memcmp(d->index_, kIdxMagic, 8) != 0) return corrupt("index.bin is not a dataset index");
  if (d->token_bytes_ < sizeof(kTokMagic) || std::memcmp(tok.first, kTokMagic, 8) != 0) return corrupt("tokens.bin is not a token file");
  uint32_t version;
  uint64_t tokens;
  std::memcpy(&version, d->index_ + 8, 4);
  std::memcpy(&d->num_samples_, d->index_ + 16, 8);
  std::memcpy(&tokens, d->index_ + 24, 8);
  if (version != kFormatVersion) return corrupt(absl::StrCat("format version ", version, ", expected ", kFormatVersion));
  // Sizes compared by division: a crafted count must not wrap a product.
  const size_t records = d->index_bytes_ - kIdxHeader, token_space = d->token_bytes_ - sizeof(kTokMagic);
  if (records % kRecord != 0 || records / kRecord != d->num_samples_) {
    return corrupt("index.bin size does not match its sample count");
  }
  if (token_space % 4 != 0 || token_space / 4 != tokens) {
    return corrupt("tokens.bin size does not match the index (truncated?)");
  }
  if (d->num_samples_ != d->info_.num_samples()) return corrupt("dataset.pbtxt and index.bin disagree on the sample count");
  if (tokens != d->info_.num_tokens()) return corrupt("dataset.pbtxt and index.bin disagree on the token count");
  if (d->info_.format_version() != kFormatVersion) {
    return corrupt(absl::StrCat("dataset.pbtxt: format version ", d->info_.format_version(), ", expected ", kFormatVersion));
  }
  if (d->info_.vocab() == 0) return corrupt("dataset.pbtxt: vocab must be positive");
  uint64_t expect = 0;  // samples are contiguous, in order
  for (uint64_t i = 0; i < d->num_samples_; ++i) {
    Record r;
    std::memcpy(&r, d->index_ + kIdxHeader + i * kRecord, kRecord);
    // 64-bit sums, each record checked against tokens.bin before the next:
    // lengths near 2^32 must not wrap into a consistent-looking index.
    const uint64_t length = uint64_t{r.input_len} + r.target_len;
    if (r.offset != expect || r.input_len == 0 || r.task >= static_cast<uint32_t>(d->info_.tasks_size()) ||
        length > tokens - expect) {
      return corrupt(absl::StrCat("index record ", i, " is inconsistent"));
    }
    expect += length;
  }
  if (expect != tokens) return corrupt("index records do not cover tokens.bin exactly");
  return d;
}

Dataset::~Dataset() {
  if (index_ != nullptr) ::munmap(const_cast<uint8_t*>(index_), index_bytes_);
  if (tokens_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(tokens_) - sizeof(kTokMagic)), token_bytes_);
  }
}

SampleView Dataset::sample(uint64_t i) const {
  Record r;
  std::memcpy(&r, index_ + kIdxHeader + i * kRecord, kRecord);
  return SampleView{std::span<const uint32_t>(tokens_ + r.offset, r.input_len),
                    std::span<const uint32_t>(tokens_ + r.offset + r.input_len, r.target_len), r.task};
}

std::vector<data::RawLength> Dataset::Lengths() const {
  std::vector<data::RawLength> out;
  out.reserve(num_samples_);
  for (uint64_t i = 0; i < num_samples_; ++i) {
    Record r;
    std::memcpy(&r, index_ + kIdxHeader + i * kRecord, kRecord);
    out.push_back({r.input_len, r.target_len});
  }
  return out;
}

absl::Status Dataset::VerifyTokens() const {
  const uint32_t vocab = info_.vocab();
  for (uint64_t i = 0; i < num_samples_; ++i) {
    const SampleView s = sample(i);
    for (const auto& part : {s.input, s.target}) {
      for (size_t k = 0; k < part.size(); ++k) {
        if (part[k] >= vocab) {
          return absl::DataLossError(absl::StrCat("tokens.bin: sample ", i, " has token id ", part[k],
                                                  ", outside the dataset's vocab ", vocab, " (dataset.pbtxt)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<data::RawLength>> ReadLengths(const std::string& path, bool indexed) {
  if (!indexed) return data::ReadLengthsFile(path);
  ASSIGN_OR_RETURN(auto d, Dataset::Open(path));
  return d->Lengths();
}

}  // namespace dynapipe::data
