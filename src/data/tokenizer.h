#pragma once

// Text to token ids for `dynapipe data import --tokenizer`: a SentencePiece
// model (the format T5, FLAN-T5 and Llama ship their tokenizers in).
//
// SentencePiece runs in a helper process, dynapipe-tokenize
// (cli/tokenize_main.cc): Debian's libsentencepiece brings its own
// protobuf-lite, which cannot share a process with the libprotobuf the rest
// of the program links. Every exchange with the helper has a deadline; a
// helper that dies or stalls is an error, never a hang.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dynapipe::data {

class Tokenizer {
 public:
  // Starts `helper` on the model file `model`. INVALID_ARGUMENT (naming the
  // file) for a file SentencePiece cannot load; NOT_FOUND when the helper
  // cannot run; DEADLINE_EXCEEDED when it does not answer within `timeout`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model, const std::string& helper,
                                                         absl::Duration timeout = absl::Seconds(60));
  // $DYNAPIPE_TOKENIZE, else dynapipe-tokenize beside this program.
  static std::string DefaultHelper();
  // Asks the helper to quit; kills it if it does not within a second.
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text` (no end-of-sequence id added).
  absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view text);
  // Ids are below this.
  uint32_t vocab_size() const { return vocab_; }
  // The end-of-sequence id, or -1 when the model has none.
  int eos_id() const { return eos_; }

 private:
  Tokenizer(pid_t pid, int fd, absl::Duration timeout) : pid_(pid), fd_(fd), timeout_(timeout) {}
  absl::Status Read(void* p, size_t n);
  absl::Status Write(const void* p, size_t n);

  pid_t pid_;
  int fd_;  // a socket to the helper's stdin and stdout
  absl::Duration timeout_;
  uint32_t vocab_ = 0;
  int eos_ = -1;
};

}  // namespace dynapipe::data
