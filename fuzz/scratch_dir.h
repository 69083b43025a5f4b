#pragma once

// Scratch space for harnesses whose parsers read files (lengths files,
// dataset directories, checkpoint shards): one directory per process, made on
// first use and removed when the process exits normally (a crash leaves it).
// It lies under $TMPDIR when that is set, else in /dev/shm where that is a
// writable directory (rewriting a file on a disk file system costs
// milliseconds: ten times the parse), else under /tmp.

#include <string>

#include "absl/strings/string_view.h"

namespace dynapipe::fuzz {

// This process's scratch directory. Aborts when it cannot be made: a harness
// without its files tests nothing, and that is a broken machine, not a finding.
const std::string& ScratchDir();

// Replaces the file at `path` with `bytes` (plain write, no fsync: the
// harness reads it back in the same process). Aborts on I/O errors, as above.
void WriteScratchFile(const std::string& path, absl::string_view bytes);

}  // namespace dynapipe::fuzz
