#include "src/data/tokenizer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dynapipe::data {

namespace {

constexpr uint32_t kQuit = 0xffffffffu;

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

}  // namespace

std::string Tokenizer::DefaultHelper() {
  if (const char* env = std::getenv("DYNAPIPE_TOKENIZE"); env != nullptr && *env != '\0') return env;
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "dynapipe-tokenize";
  std::string dir(self, static_cast<size_t>(n));
  dir.resize(dir.rfind('/') + 1);
  return dir + "dynapipe-tokenize";
}

absl::Status Tokenizer::Read(void* p, size_t n) {
  char* c = static_cast<char*>(p);
  const absl::Time deadline = absl::Now() + timeout_;
  while (n > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("the tokenizer did not answer in time");
    pollfd pfd{fd_, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, INT_MAX)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t r = ::read(fd_, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError("the tokenizer process ended");
    c += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Write(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    // MSG_NOSIGNAL: a helper that died is an error here, not a SIGPIPE.
    const ssize_t w = ::send(fd_, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::UnavailableError("the tokenizer process ended");
    c += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model, const std::string& helper,
                                                          absl::Duration timeout) {
  if (::access(helper.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("the tokenizer helper ", helper, " cannot run: ", std::strerror(errno)));
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {  // the helper: the socket as stdin and stdout, SentencePiece's logging dropped
    ::dup2(fds[1], 0);
    ::dup2(fds[1], 1);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
    char* const argv[] = {const_cast<char*>(helper.c_str()), const_cast<char*>(model.c_str()), nullptr};
    ::execv(helper.c_str(), argv);
    ::_exit(127);
  }
  ::close(fds[1]);
  std::unique_ptr<Tokenizer> t(new Tokenizer(pid, fds[0], timeout));
  char magic[6];
  if (absl::Status s = t->Read(magic, 6); !s.ok()) return absl::Status(s.code(), absl::StrCat(helper, ": ", s.message()));
  if (std::memcmp(magic, "DPTOKE", 6) == 0) {
    uint32_t n = 0;
    std::string error;
    if (t->Read(&n, 4).ok() && n < (1u << 20)) {
      error.resize(n);
      (void)t->Read(error.data(), n);
    }
    return absl::InvalidArgumentError(absl::StrCat(model, ": not a SentencePiece model (", OneLine(error), ")"));
  }
  if (std::memcmp(magic, "DPTOK1", 6) != 0) {
    return absl::InternalError(absl::StrCat(helper, ": not the tokenizer helper (bad greeting)"));
  }
  int32_t eos = -1;
  if (absl::Status s = t->Read(&t->vocab_, 4); !s.ok()) return s;
  if (absl::Status s = t->Read(&eos, 4); !s.ok()) return s;
  t->eos_ = eos;
  return t;
}

Tokenizer::~Tokenizer() {
  (void)Write(&kQuit, 4);
  ::close(fd_);
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    ::usleep(1000);
  }
}

absl::StatusOr<std::vector<uint32_t>> Tokenizer::Encode(absl::string_view text) {
  if (text.size() >= (64u << 20)) return absl::InvalidArgumentError("text longer than 64 MiB");
  const uint32_t n = static_cast<uint32_t>(text.size());
  if (absl::Status s = Write(&n, 4); !s.ok()) return s;
  if (absl::Status s = Write(text.data(), n); !s.ok()) return s;
  uint32_t code = 0, count = 0;
  if (absl::Status s = Read(&code, 4); !s.ok()) return s;
  if (absl::Status s = Read(&count, 4); !s.ok()) return s;
  if (code != 0) {
    std::string error(std::min<uint32_t>(count, 1u << 20), '\0');
    if (absl::Status s = Read(error.data(), error.size()); !s.ok()) return s;
    return absl::InvalidArgumentError(OneLine(error));
  }
  if (count > text.size() + 16) return absl::InternalError("the tokenizer answered more ids than bytes");
  std::vector<uint32_t> ids(count);
  if (absl::Status s = Read(ids.data(), ids.size() * 4); !s.ok()) return s;
  return ids;
}

}  // namespace dynapipe::data
