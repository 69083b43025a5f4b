#include "src/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/checkpoint.pb.h"
#include "src/common/file_util.h"
#include "src/common/checkpoint_layout.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::checkpoint {
namespace {

static_assert(std::endian::native == std::endian::little, "shards store raw little-endian float32");
static_assert(sizeof(float) == 4);

constexpr char kMagic[] = "DPCKPT01";
constexpr size_t kMagicSize = 8;
constexpr size_t kAlign = 8;
// A header describes names and sizes only; anything larger is corrupt.
constexpr uint32_t kMaxHeaderBytes = 64 << 20;

// A streaming 64-bit hash over 8-byte little-endian words (the tail
// zero-padded, the length mixed in at the end). Every step is a bijection of
// the state for a fixed word, so any change confined to one word always
// changes the result.
class Hasher64 {
 public:
  void Update(const char* p, size_t n) {
    if (n == 0) return;  // `p` may be null (an empty tensor)
    total_ += n;
    if (pending_ > 0) {
      const size_t take = std::min(n, kAlign - pending_);
      std::memcpy(buf_ + pending_, p, take);
      pending_ += take;
      p += take;
      n -= take;
      if (pending_ < kAlign) return;
      h_ = Step(h_, Load(buf_));
      pending_ = 0;
    }
    for (; n >= kAlign; p += kAlign, n -= kAlign) h_ = Step(h_, Load(p));
    std::memcpy(buf_, p, n);
    pending_ = n;
  }
  void Update(absl::string_view s) { Update(s.data(), s.size()); }

  uint64_t Finish() const {
    uint64_t h = h_;
    if (pending_ > 0) {
      char tail[kAlign] = {};
      std::memcpy(tail, buf_, pending_);
      h = Step(h, Load(tail));
    }
    h ^= total_;
    // MurmurHash3's finalizer.
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
  }

 private:
  static uint64_t Load(const char* p) {
    uint64_t w;
    std::memcpy(&w, p, sizeof(w));
    return w;
  }
  static uint64_t Step(uint64_t h, uint64_t w) {
    w *= 0x9e3779b97f4a7c15ULL;
    w ^= w >> 32;
    h ^= w;
    return std::rotl(h, 27) * 0x87c37b91114253d5ULL + 0x52dce729ULL;
  }

  uint64_t h_ = 0x6a09e667f3bcc908ULL;
  uint64_t total_ = 0;
  char buf_[kAlign] = {};
  size_t pending_ = 0;
};

absl::string_view Bytes(std::span<const float> data) {
  return absl::string_view(reinterpret_cast<const char*>(data.data()), data.size_bytes());
}

absl::Status FsError(const std::error_code& ec, absl::string_view what, const std::filesystem::path& path) {
  const std::string message = absl::StrCat(what, " ", path.string(), ": ", ec.message());
  if (ec == std::errc::permission_denied || ec == std::errc::operation_not_permitted) {
    return absl::PermissionDeniedError(message);
  }
  return absl::UnavailableError(message);
}

// Makes a directory entry created inside `dir` durable.
absl::Status SyncDir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("open directory ", dir.string(), ": ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::UnavailableError(absl::StrCat("fsync directory ", dir.string(), ": ", std::strerror(err)));
  return absl::OkStatus();
}

void Describe(const std::vector<TensorRef>& from, google::protobuf::RepeatedPtrField<proto::CheckpointTensor>* to) {
  for (const TensorRef& t : from) {
    proto::CheckpointTensor* d = to->Add();
    d->set_name(t.name);
    d->set_count(t.data.size());
  }
}

// Reads a shard file front to back, hashing what it reads.
class ShardReader {
 public:
  ShardReader(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~ShardReader() { ::close(fd_); }
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t hash() const { return hasher_.Finish(); }

  absl::Status DataLoss(absl::string_view why) const {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path_, ": ", why));
  }

  // Reads exactly `n` bytes into `out`; DATA_LOSS at an early end of file.
  absl::Status Read(char* out, size_t n, bool hash = true) {
    const char* start = out;
    const size_t want = n;
    while (n > 0) {
      const ssize_t got = ::read(fd_, out, n);
      if (got < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("read ", path_, ": ", std::strerror(errno)));
      }
      if (got == 0) return DataLoss("truncated");
      out += got;
      n -= static_cast<size_t>(got);
    }
    if (hash) hasher_.Update(start, want);
    offset_ += want;
    return absl::OkStatus();
  }
  // Bytes read so far.
  uint64_t offset() const { return offset_; }

 private:
  std::string path_;
  int fd_;
  Hasher64 hasher_;
  uint64_t offset_ = 0;
};

// The magic, the header's length and the header of a `file_size`-byte shard.
absl::StatusOr<proto::CheckpointHeader> ReadHeader(ShardReader& reader, uint64_t file_size) {
  char magic[kMagicSize];
  RETURN_IF_ERROR(reader.Read(magic, kMagicSize));
  if (std::memcmp(magic, kMagic, kMagicSize) != 0) return reader.DataLoss("not a DPCKPT01 shard (bad magic)");
  uint32_t header_len;
  RETURN_IF_ERROR(reader.Read(reinterpret_cast<char*>(&header_len), sizeof(header_len)));
  if (header_len > kMaxHeaderBytes || kMagicSize + sizeof(header_len) + header_len > file_size) {
    return reader.DataLoss(
        absl::StrCat("header length ", header_len, " does not fit the file's ", file_size, " bytes"));
  }
  std::string header_bytes(header_len, '\0');
  RETURN_IF_ERROR(reader.Read(header_bytes.data(), header_len));
  proto::CheckpointHeader header;
  if (!header.ParseFromString(header_bytes)) return reader.DataLoss("header does not parse");
  return header;
}

ShardInfo InfoOf(const proto::CheckpointHeader& header) {
  ShardInfo info;
  info.iteration = header.iteration();
  info.rank = header.rank();
  info.pp_rank = header.pp_rank();
  info.dp_rank = header.dp_rank();
  info.world = header.world();
  info.optimizer_step = header.optimizer_step();
  info.job_fingerprint = header.job_fingerprint();
  return info;
}

// Bytes of float data the header describes; false on overflow.
bool DataBytes(const proto::CheckpointHeader& h, uint64_t* bytes) {
  uint64_t total = 0;
  for (const auto* list : {&h.params(), &h.adam_m(), &h.adam_v()}) {
    for (const auto& t : *list) {
      if (t.count() > std::numeric_limits<uint64_t>::max() / 4 - total / 4) return false;
      total += 4 * t.count();
    }
  }
  *bytes = total;
  return true;
}

absl::Status ReadTensors(ShardReader& reader, const google::protobuf::RepeatedPtrField<proto::CheckpointTensor>& from,
                         std::vector<Tensor>* to) {
  to->reserve(from.size());
  for (const auto& d : from) {
    Tensor& t = to->emplace_back();
    t.name = d.name();
    t.data.resize(d.count());
    RETURN_IF_ERROR(reader.Read(reinterpret_cast<char*>(t.data.data()), d.count() * sizeof(float)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteShard(absl::string_view dir, const ShardRef& shard, const std::function<bool()>& cancelled) {
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint dir: must be set");
  if (shard.iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard.iteration: ", shard.iteration, " is negative"));
  }
  if (shard.world < 1 || shard.rank < 0 || shard.rank >= shard.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard.rank: ", shard.rank, " is not a rank of a world of ", shard.world));
  }
  const std::filesystem::path path = ShardPath(dir, shard.iteration, shard.rank);
  const std::filesystem::path iter_dir = path.parent_path();
  const std::filesystem::path root(std::string{dir});
  std::error_code ec;
  const bool root_existed = std::filesystem::exists(root, ec);
  std::filesystem::create_directories(iter_dir, ec);
  if (ec) return FsError(ec, "create directory", iter_dir);
  // The directory entries must survive a crash as much as the file does, also
  // when another rank created them and has not synced them yet.
  if (!root_existed && root.has_parent_path()) RETURN_IF_ERROR(SyncDir(root.parent_path()));
  RETURN_IF_ERROR(SyncDir(root));

  proto::CheckpointHeader header;
  header.set_iteration(shard.iteration);
  header.set_rank(shard.rank);
  header.set_pp_rank(shard.pp_rank);
  header.set_dp_rank(shard.dp_rank);
  header.set_world(shard.world);
  header.set_optimizer_step(shard.optimizer_step);
  header.set_job_fingerprint(shard.job_fingerprint);
  Describe(shard.params, header.mutable_params());
  Describe(shard.adam_m, header.mutable_adam_m());
  Describe(shard.adam_v, header.mutable_adam_v());
  const std::string header_bytes = header.SerializeAsString();
  if (header_bytes.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard: header of ", header_bytes.size(), " bytes (tensor names) exceeds ", kMaxHeaderBytes));
  }

  std::string prefix(kMagic, kMagicSize);
  const uint32_t len = static_cast<uint32_t>(header_bytes.size());
  prefix.append(reinterpret_cast<const char*>(&len), sizeof(len));
  prefix += header_bytes;
  prefix.resize((prefix.size() + kAlign - 1) / kAlign * kAlign, '\0');

  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Create(path.string()));
  Hasher64 hasher;
  constexpr size_t kPiece = size_t{16} << 20;
  auto append = [&](absl::string_view bytes) {
    for (size_t at = 0; at < bytes.size(); at += kPiece) {
      if (cancelled && cancelled()) {
        return absl::CancelledError(absl::StrCat(path.string(), ": write cancelled; the shard is discarded"));
      }
      const absl::string_view piece = bytes.substr(at, kPiece);
      hasher.Update(piece);
      RETURN_IF_ERROR(out->Append(piece));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(append(prefix));
  for (const auto* list : {&shard.params, &shard.adam_m, &shard.adam_v}) {
    for (const TensorRef& t : *list) RETURN_IF_ERROR(append(Bytes(t.data)));
  }
  const uint64_t checksum = hasher.Finish();
  RETURN_IF_ERROR(out->Append(absl::string_view(reinterpret_cast<const char*>(&checksum), sizeof(checksum))));
  if (cancelled && cancelled()) {
    return absl::CancelledError(absl::StrCat(path.string(), ": write cancelled; the shard is discarded"));
  }
  return out->Commit();
}

namespace {

// Shard (iteration, rank) of `dir`, opened for reading: NOT_FOUND if absent,
// DATA_LOSS if not a regular file; `*size` is its size.
absl::StatusOr<std::unique_ptr<ShardReader>> OpenShard(absl::string_view dir, int64_t iteration, int rank,
                                                       uint64_t* size) {
  const std::string path = ShardPath(dir, iteration, rank);
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("checkpoint shard ", path, " not found"));
    return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(err)));
  }
  auto reader = std::make_unique<ShardReader>(path, fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::UnavailableError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return reader->DataLoss("not a regular file");
  *size = static_cast<uint64_t>(st.st_size);
  return reader;
}

// DATA_LOSS unless `header` is of the shard its path names.
absl::Status CheckPlace(const ShardReader& reader, const proto::CheckpointHeader& header, int64_t iteration,
                        int rank) {
  if (header.iteration() != iteration || header.rank() != rank) {
    return reader.DataLoss(absl::StrCat("holds iteration ", header.iteration(), " rank ", header.rank(),
                                        ", not what its path says"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardInfo> ReadShardInfo(absl::string_view dir, int64_t iteration, int rank) {
  uint64_t file_size = 0;
  ASSIGN_OR_RETURN(const std::unique_ptr<ShardReader> reader, OpenShard(dir, iteration, rank, &file_size));
  ASSIGN_OR_RETURN(const proto::CheckpointHeader header, ReadHeader(*reader, file_size));
  RETURN_IF_ERROR(CheckPlace(*reader, header, iteration, rank));
  return InfoOf(header);
}

absl::StatusOr<Shard> ReadShard(absl::string_view dir, int64_t iteration, int rank) {
  uint64_t file_size = 0;
  ASSIGN_OR_RETURN(const std::unique_ptr<ShardReader> opened, OpenShard(dir, iteration, rank, &file_size));
  ShardReader& reader = *opened;
  ASSIGN_OR_RETURN(const proto::CheckpointHeader header, ReadHeader(reader, file_size));
  const uint64_t header_end = reader.offset();
  const uint64_t data_start = (header_end + kAlign - 1) / kAlign * kAlign;
  uint64_t data_bytes;
  if (!DataBytes(header, &data_bytes) || data_bytes > file_size) {
    return reader.DataLoss("header describes more data than the file holds");
  }
  const uint64_t expected = data_start + data_bytes + sizeof(uint64_t);
  if (file_size != expected) {
    return reader.DataLoss(absl::StrCat(file_size < expected ? "truncated" : "trailing bytes", ": ", file_size,
                                        " bytes, the header describes ", expected));
  }
  RETURN_IF_ERROR(CheckPlace(reader, header, iteration, rank));
  // A name listed twice would let one tensor's values silently replace another's.
  for (const auto* list : {&header.params(), &header.adam_m(), &header.adam_v()}) {
    std::set<absl::string_view> names;
    for (const auto& t : *list) {
      if (!names.insert(t.name()).second) {
        return reader.DataLoss(absl::StrCat("tensor \"", absl::CHexEscape(t.name()), "\" is listed twice"));
      }
    }
  }
  char pad[kAlign];
  RETURN_IF_ERROR(reader.Read(pad, data_start - header_end));

  Shard shard;
  static_cast<ShardInfo&>(shard) = InfoOf(header);
  RETURN_IF_ERROR(ReadTensors(reader, header.params(), &shard.params));
  RETURN_IF_ERROR(ReadTensors(reader, header.adam_m(), &shard.adam_m));
  RETURN_IF_ERROR(ReadTensors(reader, header.adam_v(), &shard.adam_v));
  const uint64_t computed = reader.hash();
  uint64_t stored;
  RETURN_IF_ERROR(reader.Read(reinterpret_cast<char*>(&stored), sizeof(stored), /*hash=*/false));
  if (stored != computed) return reader.DataLoss("checksum mismatch (corrupt bytes)");
  return shard;
}

uint64_t JobFingerprint(const spec::NormalizedJobSpec& normalized) {
  // Defaults written out, so a spec and its normalised form are one job.
  const proto::JobSpec& spec = normalized.proto();
  proto::JobSpec canonical;
  *canonical.mutable_model() = spec.model();
  canonical.mutable_model()->clear_name();
  *canonical.mutable_parallelism() = spec.parallelism();
  canonical.mutable_optimizer()->set_zero1(spec.optimizer().zero1());
  // Buckets change how gradients travel, not the tensors a rank keeps.
  canonical.mutable_parallelism()->clear_grad_bucket_mb();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    canonical.SerializeToCodedStream(&coded);
  }
  Hasher64 hasher;
  hasher.Update(bytes);
  return hasher.Finish();
}

absl::Status CheckSameJob(const ShardInfo& want, const ShardInfo& got) {
  auto mismatch = [&](absl::string_view field, const auto& shard, const auto& job, absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint shard of iteration ", got.iteration, " rank ",
                                                      got.rank, ": ", field, " ", shard, " differs from this job's ",
                                                      job, why));
  };
  if (got.job_fingerprint != want.job_fingerprint) {
    return mismatch("job_fingerprint", absl::Hex(got.job_fingerprint), absl::Hex(want.job_fingerprint),
                    " (another model or parallelism)");
  }
  if (got.world != want.world) return mismatch("world", got.world, want.world, "");
  if (got.rank != want.rank) return mismatch("rank", got.rank, want.rank, "");
  if (got.pp_rank != want.pp_rank) return mismatch("pp_rank", got.pp_rank, want.pp_rank, "");
  if (got.dp_rank != want.dp_rank) return mismatch("dp_rank", got.dp_rank, want.dp_rank, "");
  return absl::OkStatus();
}

}  // namespace dynapipe::checkpoint
