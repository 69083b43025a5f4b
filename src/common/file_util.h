#pragma once

// Whole-file reads and crash-safe writes.

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dynapipe {

// `path` confined to `root` (the working directory when empty): a relative
// path joins `root`; an absolute one must already lie under it. Symbolic
// links are resolved as far as the path exists, so a link cannot lead out.
// INVALID_ARGUMENT names the path and the root ("outside --data-root") for a
// ".." component or anything that leaves the root; `root` itself must exist.
// Returns the resolved path.
absl::StatusOr<std::string> ConfinedPath(absl::string_view root, absl::string_view path);

// What ReadFile reads at most unless told otherwise.
inline constexpr size_t kMaxReadFileBytes = size_t{1} << 30;

// The whole regular file at `path`. NOT_FOUND when it does not exist;
// INVALID_ARGUMENT, naming the path, for what is not a regular file (a
// device such as /dev/zero, a FIFO, a directory) or holds more than
// `max_bytes`; UNAVAILABLE for other I/O errors. Never reads past max_bytes.
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes = kMaxReadFileBytes);

// What a secret file (an API token, a Redis password) may hold at most.
inline constexpr size_t kMaxSecretFileBytes = size_t{64} << 10;

// The whole secret file at `path` (API token, Redis password), read like
// ReadFile. FAILED_PRECONDITION, in one line naming the file, its mode and the
// fix ("chmod 600 FILE"), when other users may read or write it or its group
// may write it: a leaked or replaceable secret must stop a daemon, not run it.
// Group read (0640) is allowed for a group the daemon's user shares.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it
// over `path` and fsyncs the directory: readers see the old or the new file,
// never a torn one.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);

// WriteFileAtomic in pieces, for contents too large to hold twice in memory
// (checkpoint shards): Append writes to the temporary file, Commit fsyncs,
// renames and fsyncs the directory. Destroyed without a successful Commit,
// it removes the temporary file and `path` is untouched.
class AtomicFileWriter {
 public:
  // Creates the temporary file `path`.tmp.PID (the directory must exist).
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends `bytes` to the temporary file.
  absl::Status Append(absl::string_view bytes);
  // Makes the file appear at `path`; the writer is finished afterwards either way.
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd) : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  void Abandon();

  std::string path_, tmp_;
  int fd_;  // -1 once committed or abandoned
};

}  // namespace dynapipe
