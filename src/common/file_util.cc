#include "src/common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
  // The medium cannot give the bytes back (or the file is not readable data,
  // as /proc/self/mem): not an outage that a retry fixes.
  if (err == EIO) return absl::DataLossError(message);
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

absl::StatusOr<std::string> ConfinedPath(absl::string_view root_arg, absl::string_view path_arg) {
  namespace fs = std::filesystem;
  const std::string root_name = root_arg.empty() ? "." : std::string(root_arg);
  auto outside = [&] {
    return absl::InvalidArgumentError(absl::StrCat(path_arg, " is outside --data-root ", root_name));
  };
  if (path_arg.empty()) return absl::InvalidArgumentError("empty path");
  if (path_arg.find('\0') != absl::string_view::npos) return absl::InvalidArgumentError("path contains a NUL byte");
  const fs::path given{std::string(path_arg)};
  for (const fs::path& part : given) {
    if (part == "..") return outside();
  }
  std::error_code ec;
  const fs::path root = fs::canonical(root_name, ec);
  if (ec) return ErrnoStatus(ec.value(), "--data-root", root_name);
  const fs::path joined = given.is_absolute() ? given : root / given;
  // Resolve the longest prefix that exists; what follows it cannot be a link.
  fs::path existing = joined.lexically_normal(), rest;
  while (!existing.empty() && !fs::exists(fs::symlink_status(existing, ec))) {
    rest = rest.empty() ? existing.filename() : existing.filename() / rest;
    const fs::path parent = existing.parent_path();
    if (parent == existing) break;
    existing = parent;
  }
  fs::path resolved = fs::canonical(existing, ec);
  if (ec) return ErrnoStatus(ec.value(), "resolve", std::string(path_arg));
  if (!rest.empty()) resolved /= rest;
  resolved = resolved.lexically_normal();
  const auto [r, p] = std::mismatch(root.begin(), root.end(), resolved.begin(), resolved.end());
  if (r != root.end()) return outside();
  std::string out = resolved.string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

namespace {

// ReadFile, with `check` (when set) judging the open file before it is read:
// the file checked is the file read, whatever renames happen meanwhile.
absl::StatusOr<std::string> ReadCheckedFile(const std::string& path, size_t max_bytes,
                                            const std::function<absl::Status(const struct stat&)>& check) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  if (check) {
    if (absl::Status s = check(st); !s.ok()) return s;
  }
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

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  return ReadCheckedFile(path, max_bytes, nullptr);
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  return ReadCheckedFile(path, kMaxSecretFileBytes, [&path](const struct stat& st) {
    // Others: any access; group: write. (Group read is how a root-owned
    // secret is shared with a service user: root:dynapipe 0640.)
    constexpr mode_t kUnsafe = S_IRWXO | S_IWGRP;
    if ((st.st_mode & kUnsafe) == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s has mode %04o: a secret file must not be readable by other users or writable by anyone but its owner; "
        "fix: chmod 600 %s",
        path, st.st_mode & 07777, path));
  });
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
