#include "src/testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/testing/loopback.h"

namespace dynapipe::testing {

absl::StatusOr<int> PickFreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(err)));
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

bool RedisAnswersPing(int port, absl::Duration timeout) {
  const int fd = ConnectLoopback(port, timeout);
  if (fd < 0) return false;
  const char ping[] = "PING\r\n";
  bool ok = ::send(fd, ping, sizeof(ping) - 1, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(ping) - 1);
  char reply[16] = {};
  ok = ok && ::recv(fd, reply, sizeof(reply) - 1, 0) >= 5 && std::strncmp(reply, "+PONG", 5) == 0;
  ::close(fd);
  return ok;
}

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(absl::Duration timeout, bool persistent) {
  absl::Status last = absl::UnavailableError("no attempt");
  // Another process may take the port between picking and binding: retry.
  for (int attempt = 0; attempt < 5; ++attempt) {
    absl::StatusOr<int> port = PickFreeLoopbackPort();
    if (!port.ok()) return port.status();
    std::string dir;
    if (persistent) {
      const char* tmp = std::getenv("TEST_TMPDIR");
      dir = absl::StrCat(tmp ? tmp : "/tmp", "/redis-", ::getpid(), "-", *port);
      std::filesystem::create_directories(dir);
    }
    std::unique_ptr<RedisServer> server(new RedisServer(*port, dir));
    last = server->Spawn(timeout);
    if (last.ok()) return server;
  }
  return last;
}

absl::Status RedisServer::Spawn(absl::Duration timeout) {
  const std::string port = std::to_string(port_);
  std::vector<std::string> args = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", dir_.empty() ? "no" : "yes",
                                   "--appendfsync", "always", "--daemonize", "no",
                                   "--loglevel", "warning", "--logfile", "", "--dir", dir_.empty() ? "/tmp" : dir_};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::execvp("redis-server", argv.data());
    std::fprintf(stderr, "exec redis-server: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  pid_ = pid;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (RedisAnswersPing(port_, absl::Milliseconds(200))) return absl::OkStatus();
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("redis-server on port ", port_, " exited early (status ",
                                                 status, "); is redis-server installed?"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  Stop();
  return absl::DeadlineExceededError(absl::StrCat("redis-server on port ", port_, " did not answer PING within ",
                                                  absl::FormatDuration(timeout)));
}

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 250; ++i) {  // up to 5 s for a clean exit
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

absl::Status RedisServer::Restart(absl::Duration timeout) {
  Stop();
  return Spawn(timeout);
}

RedisServer::~RedisServer() { Stop(); }

}  // namespace dynapipe::testing
