#pragma once

// A thread-safe Redis client over hiredis: a small pool of connections, each
// with connect and command timeouts, reconnecting with jittered exponential
// backoff after failures, AUTH when a password is configured. Connection
// failures and timeouts are UNAVAILABLE (callers retry); a Redis error reply
// is INTERNAL (or UNAUTHENTICATED for auth failures).

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"

struct redisContext;

namespace dynapipe::store {

// Redis's own default port: the planner's --redis and RedisOptions.
inline constexpr int kDefaultRedisPort = 6379;

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = kDefaultRedisPort;
  std::string password;  // empty: no AUTH
  absl::Duration connect_timeout = absl::Seconds(1);
  absl::Duration command_timeout = absl::Seconds(2);
  int pool_size = 8;
  absl::Duration min_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
};

// The password from `file` (first line) if set, else from environment
// variable `env` if set, else empty. NOT_FOUND if the file is missing,
// FAILED_PRECONDITION if others may read it (ReadSecretFile).
absl::StatusOr<std::string> ReadRedisPassword(const std::string& file, const char* env = "DYNAPIPE_REDIS_PASSWORD");

struct RedisReply {
  enum class Type { kNil, kString, kInteger, kArray, kStatus };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus
  int64_t integer = 0;
  std::vector<RedisReply> elements;
  bool is_nil() const { return type == Type::kNil; }
};

// Sockets that threads are blocked on, so another thread can wake them all
// (shutdown(2): the blocked read or write fails at once) when the process
// stops. A socket is entered before its use and left before it is closed, so
// a descriptor number reused after the close is never touched.
class SocketInterrupter {
 public:
  // False once Interrupt() ran: the caller must not start the I/O.
  bool Enter(int fd);
  void Leave(int fd);
  // Final: wakes every entered socket; later Enter calls fail.
  void Interrupt();
  bool interrupted() const;

 private:
  mutable Mutex mu_;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::multiset<int> fds_ ABSL_GUARDED_BY(mu_);
};

class RedisClient {
 public:
  explicit RedisClient(RedisOptions options, Clock* clock = Clock::Real());
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command (binary-safe arguments).
  absl::StatusOr<RedisReply> Command(const std::vector<std::string>& args);
  absl::StatusOr<RedisReply> Command(std::initializer_list<absl::string_view> args);

  // True when the last command on any connection succeeded.
  bool healthy() const { return healthy_.load(); }
  // Failed commands since start (connection errors, timeouts, error replies).
  int64_t errors() const { return errors_.load(); }
  // When a command last failed to reach Redis or took longer than
  // kSlowCommand (a stalled or overloaded Redis); InfinitePast if never.
  absl::Time last_trouble() const;
  static constexpr absl::Duration kSlowCommand = absl::Milliseconds(500);
  const RedisOptions& options() const { return options_; }
  // Thread-safe and final, for a daemon's exit: commands waiting on Redis (a
  // stalled one, a lost connection) fail at once, and so does every later
  // command, UNAVAILABLE. A connection attempt in progress ends within
  // connect_timeout.
  void Shutdown();

 private:
  struct Connection;
  // Null once shut down.
  Connection* Acquire();
  void Release(Connection* c);
  absl::StatusOr<RedisReply> Run(Connection* c, const std::vector<std::string>& args);
  absl::Status Connect(Connection* c);
  // Frees c's context (leaving the interrupter first).
  void Close(Connection* c);

  RedisOptions options_;
  Clock* clock_;
  Mutex mu_;
  std::vector<std::unique_ptr<Connection>> all_;
  std::vector<Connection*> idle_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  SocketInterrupter sockets_;
  std::atomic<bool> healthy_{false};
  std::atomic<int64_t> errors_{0};
  std::atomic<int64_t> last_trouble_ns_{INT64_MIN};  // unix ns on clock_
};

}  // namespace dynapipe::store
