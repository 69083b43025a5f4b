#include "src/store/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <cstdlib>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "src/common/file_util.h"

namespace dynapipe::store {

bool SocketInterrupter::Enter(int fd) {
  MutexLock lock(&mu_);
  if (interrupted_) return false;
  fds_.insert(fd);
  return true;
}

void SocketInterrupter::Leave(int fd) {
  MutexLock lock(&mu_);
  if (auto it = fds_.find(fd); it != fds_.end()) fds_.erase(it);
}

void SocketInterrupter::Interrupt() {
  MutexLock lock(&mu_);
  interrupted_ = true;
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
}

bool SocketInterrupter::interrupted() const {
  MutexLock lock(&mu_);
  return interrupted_;
}

struct RedisClient::Connection {
  redisContext* ctx = nullptr;
  bool entered = false;  // ctx's socket is in the client's SocketInterrupter
  absl::Time next_attempt = absl::InfinitePast();
  absl::Duration backoff = absl::ZeroDuration();
  ~Connection() {
    if (ctx != nullptr) redisFree(ctx);
  }
};

absl::StatusOr<std::string> ReadRedisPassword(const std::string& file, const char* env) {
  if (!file.empty()) {
    auto text = ReadSecretFile(file);
    if (!text.ok()) return text.status();
    const size_t nl = text->find('\n');
    return std::string(absl::StripAsciiWhitespace(text->substr(0, nl)));
  }
  if (const char* v = env != nullptr ? std::getenv(env) : nullptr) return std::string(v);
  return std::string();
}

namespace {

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
      break;
    default: out.type = RedisReply::Type::kNil; break;
  }
  return out;
}

}  // namespace

RedisClient::RedisClient(RedisOptions options, Clock* clock) : options_(std::move(options)), clock_(clock) {
  const int n = std::max(1, options_.pool_size);
  for (int i = 0; i < n; ++i) all_.push_back(std::make_unique<Connection>());
  MutexLock lock(&mu_);
  for (auto& c : all_) idle_.push_back(c.get());
}

RedisClient::~RedisClient() = default;

RedisClient::Connection* RedisClient::Acquire() {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !idle_.empty() || shut_down_; });
  if (shut_down_) return nullptr;
  Connection* c = idle_.back();
  idle_.pop_back();
  return c;
}

void RedisClient::Release(Connection* c) {
  MutexLock lock(&mu_);
  idle_.push_back(c);
}

void RedisClient::Shutdown() {
  {
    MutexLock lock(&mu_);
    shut_down_ = true;
  }
  sockets_.Interrupt();
}

namespace {
absl::Status ShutDownError(const RedisOptions& o) {
  return absl::UnavailableError(absl::StrCat("redis ", o.host, ":", o.port, ": client shutting down"));
}
}  // namespace

void RedisClient::Close(Connection* c) {
  if (c->ctx == nullptr) return;
  if (c->entered) sockets_.Leave(c->ctx->fd);
  c->entered = false;
  redisFree(c->ctx);
  c->ctx = nullptr;
}

absl::Status RedisClient::Connect(Connection* c) {
  const absl::Time now = clock_->Now();
  if (now < c->next_attempt) {
    return absl::UnavailableError(absl::StrCat("redis ", options_.host, ":", options_.port,
                                               " unreachable; next attempt in ",
                                               absl::FormatDuration(c->next_attempt - now)));
  }
  Close(c);
  auto fail = [&](const std::string& why) {
    // Jittered exponential backoff between reconnection attempts.
    c->backoff = c->backoff == absl::ZeroDuration() ? options_.min_backoff : std::min(2 * c->backoff, options_.max_backoff);
    thread_local std::mt19937 rng(std::random_device{}());
    const double jitter = std::uniform_real_distribution<double>(0.5, 1.0)(rng);
    c->next_attempt = now + c->backoff * jitter;
    Close(c);
    return absl::UnavailableError(absl::StrCat("redis ", options_.host, ":", options_.port, ": ", why));
  };
  c->ctx = redisConnectWithTimeout(options_.host.c_str(), options_.port, absl::ToTimeval(options_.connect_timeout));
  if (c->ctx == nullptr) return fail("out of memory");
  if (c->ctx->err) return fail(c->ctx->errstr);
  if (!sockets_.Enter(c->ctx->fd)) {
    Close(c);
    return ShutDownError(options_);
  }
  c->entered = true;
  redisSetTimeout(c->ctx, absl::ToTimeval(options_.command_timeout));
  if (!options_.password.empty()) {
    auto* r = static_cast<redisReply*>(redisCommand(c->ctx, "AUTH %b", options_.password.data(), options_.password.size()));
    const bool ok = r != nullptr && r->type != REDIS_REPLY_ERROR;
    const std::string why = r == nullptr ? std::string(c->ctx->errstr) : r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "";
    if (r != nullptr) freeReplyObject(r);
    if (!ok) {
      // Only a refused password is an authentication error; a network
      // failure or a loading server during AUTH is worth retrying.
      const bool refused = why.rfind("WRONGPASS", 0) == 0 || why.rfind("ERR", 0) == 0 || why.rfind("NOAUTH", 0) == 0;
      const absl::Status unreachable = fail(why);
      return refused ? absl::UnauthenticatedError(absl::StrCat("redis AUTH: ", why)) : unreachable;
    }
  }
  c->backoff = absl::ZeroDuration();
  return absl::OkStatus();
}

absl::StatusOr<RedisReply> RedisClient::Run(Connection* c, const std::vector<std::string>& args) {
  if (c->ctx == nullptr || c->ctx->err) {
    if (absl::Status s = Connect(c); !s.ok()) return s;
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(c->ctx, static_cast<int>(args.size()), argv.data(), lens.data()));
  if (r == nullptr) {
    const std::string why = c->ctx->errstr;
    Close(c);  // the connection state is unknown after a timeout
    if (sockets_.interrupted()) return ShutDownError(options_);
    return absl::UnavailableError(absl::StrCat("redis ", options_.host, ":", options_.port, ": ", why));
  }
  if (r->type == REDIS_REPLY_ERROR) {
    const std::string err(r->str, r->len);
    freeReplyObject(r);
    if (err.rfind("NOAUTH", 0) == 0 || err.rfind("WRONGPASS", 0) == 0) return absl::UnauthenticatedError(absl::StrCat("redis: ", err));
    if (err.rfind("LOADING", 0) == 0 || err.rfind("BUSY", 0) == 0) return absl::UnavailableError(absl::StrCat("redis: ", err));
    return absl::InternalError(absl::StrCat("redis ", args.empty() ? "" : args[0], ": ", err));
  }
  RedisReply out = Convert(r);
  freeReplyObject(r);
  return out;
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& args) {
  const absl::Time start = clock_->Now();
  Connection* c = Acquire();
  if (c == nullptr) return ShutDownError(options_);
  auto result = Run(c, args);
  Release(c);
  if (!result.ok()) ++errors_;
  // An error reply still means Redis is reachable.
  const bool reachable = result.ok() || result.status().code() == absl::StatusCode::kInternal;
  healthy_.store(reachable);
  const absl::Time end = clock_->Now();
  if (!reachable || end - start > kSlowCommand) last_trouble_ns_.store(absl::ToUnixNanos(end));
  return result;
}

absl::Time RedisClient::last_trouble() const {
  const int64_t ns = last_trouble_ns_.load();
  return ns == INT64_MIN ? absl::InfinitePast() : absl::FromUnixNanos(ns);
}

absl::StatusOr<RedisReply> RedisClient::Command(std::initializer_list<absl::string_view> args) {
  std::vector<std::string> v;
  v.reserve(args.size());
  for (absl::string_view a : args) v.emplace_back(a);
  return Command(v);
}

}  // namespace dynapipe::store
