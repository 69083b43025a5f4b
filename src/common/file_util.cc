#include "src/common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace dynapipe {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what, absl::string_view path) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  // A path that cannot name a file here: retrying will not help.
  if (err == ENOTDIR || err == EISDIR || err == ENAMETOOLONG || err == ELOOP) {
    return absl::InvalidArgumentError(message);
  }
  return absl::UnavailableError(message);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::string ResolvePath(absl::string_view root, absl::string_view path) {
  const std::filesystem::path p{std::string(path)};
  if (root.empty() || p.empty() || p.is_absolute()) return p.string();
  return (std::filesystem::path(std::string(root)) / p).string();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  auto too_large = [&] {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than the limit of ", max_bytes, " bytes"));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_large();
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (out.size() + static_cast<size_t>(n) > max_bytes) return too_large();  // it grew while read
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) {
  auto writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append(contents); !s.ok()) return s;
  return (*writer)->Commit();
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "create", tmp);
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(tmp), fd));
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
}

absl::Status AtomicFileWriter::Append(absl::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("write ", tmp_, ": writer already finished"));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      Abandon();
      return ErrnoStatus(err, "write", tmp_);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("commit ", tmp_, ": writer already finished"));
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp_.c_str());
    return ErrnoStatus(err, "fsync", tmp_);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return ErrnoStatus(err, "close", tmp_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return ErrnoStatus(err, "rename to", path_);
  }
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0 || ::fsync(dfd.get()) != 0) return ErrnoStatus(errno, "fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace dynapipe
