#include "src/store/redis_plan_store.h"

#include <hiredis/hiredis.h>
#include <poll.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/status_macros.h"
#include "src/plan/plan_seal.h"

namespace dynapipe::store {
namespace {

// KEYS: lease, planned, progress, events, plan keys...; ARGV: owner, ttl_ms,
// iteration, event, plan bytes (one per plan key, at the same offset).
constexpr char kCommitScript[] = R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for i = 5, #KEYS do redis.call('SET', KEYS[i], ARGV[i], 'PX', ARGV[2]) end
redis.call('SET', KEYS[2], '1')
redis.call('HINCRBY', KEYS[3], 'writes:' .. ARGV[3], 1)
local cur = tonumber(redis.call('HGET', KEYS[3], 'planned') or '-1')
if tonumber(ARGV[3]) > cur then redis.call('HSET', KEYS[3], 'planned', ARGV[3]) end
redis.call('PUBLISH', KEYS[4], ARGV[4])
return 1
)lua";

// KEYS: state hash, events; ARGV: state, error, now_ms, event. Terminal
// states (succeeded 4, failed 5, cancelled 6) never change.
constexpr char kStateScript[] = R"lua(
local cur = tonumber(redis.call('HGET', KEYS[1], 'state') or '0')
if cur >= 4 then return 0 end
if tonumber(ARGV[1]) == 1 and cur ~= 1 then return 0 end
if cur == tonumber(ARGV[1]) and redis.call('HGET', KEYS[1], 'error') == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'error', ARGV[2], 'update_ms', ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[4])
return 1
)lua";

// KEYS: the job's n rank keys, then the n executors' seat keys; ARGV: job,
// then the n executor ids (rank order). All or nothing.
constexpr char kGangScript[] = R"lua(
local n = #KEYS / 2
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1 + i])
  redis.call('SET', KEYS[n + i], ARGV[1] .. ' ' .. (i - 1))
end
return 1
)lua";

// KEYS: a seat key; ARGV: job. Deletes the seat if it is in that job.
constexpr char kReleaseSeatScript[] = R"lua(
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then redis.call('DEL', KEYS[1]) end
return 0
)lua";

// KEYS[1] history (sorted set by iteration); ARGV: iteration, summary, the
// most entries kept. One entry per iteration: a rewrite replaces it.
constexpr char kHistoryScript[] = R"lua(
redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
local n = redis.call('ZCARD', KEYS[1])
local keep = tonumber(ARGV[3])
if n > keep then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - keep - 1) end
return n
)lua";

// KEYS: metrics key, progress, events; ARGV: report bytes, ttl_ms, rank, iteration, event.
constexpr char kReportScript[] = R"lua(
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local field = 'done:' .. ARGV[3]
local cur = tonumber(redis.call('HGET', KEYS[2], field) or '-1')
if tonumber(ARGV[4]) > cur then redis.call('HSET', KEYS[2], field, ARGV[4]) end
redis.call('PUBLISH', KEYS[3], ARGV[5])
return 1
)lua";

// One atomic step: a job is either fully created or not at all. KEYS:
// counter, jobs set, events, store id; ARGV: key prefix, spec bytes, pending
// state, now_ms, start iteration, world size, start iteration - 1, a fresh
// store id (used when the store has none yet). A job starting
// after 0 has every rank's last done iteration at start - 1.
constexpr char kCreateScript[] = R"lua(
local sid = redis.call('GET', KEYS[4])
if not sid then
  sid = ARGV[8]
  redis.call('SET', KEYS[4], sid)
end
local n = redis.call('INCR', KEYS[1])
local id = string.format('job-%s-%06d', sid, n)
local job = ARGV[1] .. 'job:' .. id
redis.call('SET', job .. ':spec', ARGV[2])
redis.call('HSET', job .. ':state', 'state', ARGV[3], 'error', '', 'submit_ms', ARGV[4], 'update_ms', ARGV[4],
           'start_iteration', ARGV[5])
if tonumber(ARGV[5]) > 0 then
  for r = 0, tonumber(ARGV[6]) - 1 do redis.call('HSET', job .. ':progress', 'done:' .. r, ARGV[7]) end
end
redis.call('SADD', KEYS[2], id)
redis.call('PUBLISH', KEYS[3], 'job ' .. id)
return id
)lua";

// KEYS: store id; ARGV: a fresh id, set if there is none. The id.
constexpr char kStoreIdScript[] = R"lua(
local sid = redis.call('GET', KEYS[1])
if not sid then
  sid = ARGV[1]
  redis.call('SET', KEYS[1], sid)
end
return sid
)lua";

// KEYS: ranks set, latest key; ARGV: rank, world, iteration. 1 only for the
// mark that completes the set.
constexpr char kMarkCheckpointScript[] = R"lua(
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '-1')
if tonumber(ARGV[3]) > cur then redis.call('SET', KEYS[2], ARGV[3]) end
return 1
)lua";

// KEYS: lease; ARGV: owner.
constexpr char kReleaseScript[] = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
)lua";

std::string Ms(absl::Duration d) { return std::to_string(std::max<int64_t>(1, absl::ToInt64Milliseconds(d))); }

absl::StatusOr<int64_t> ParseInt(const RedisReply& r, int64_t fallback) {
  if (r.is_nil()) return fallback;
  if (r.type == RedisReply::Type::kInteger) return r.integer;
  int64_t v;
  if (!absl::SimpleAtoi(r.str, &v)) return absl::DataLossError(absl::StrCat("not an integer: \"", r.str, "\""));
  return v;
}

}  // namespace

absl::StatusOr<proto::ExecutionPlan> DecodePlan(const std::string& bytes, const std::string& what) {
  proto::ExecutionPlan plan;
  if (!plan.ParseFromString(bytes)) return absl::DataLossError(absl::StrCat(what, ": stored bytes do not parse as a plan"));
  if (plan.checksum() == 0 || plan.checksum() != plan::PlanChecksum(plan)) {
    return absl::DataLossError(absl::StrCat(what, ": checksum mismatch (corrupt or truncated plan)"));
  }
  return plan;
}

absl::StatusOr<proto::ExecutionPlan> DecodePlanFor(const std::string& bytes, const std::string& job,
                                                   int64_t iteration, int rank) {
  const std::string what = absl::StrCat("plan of job ", job, " iteration ", iteration, " rank ", rank);
  ASSIGN_OR_RETURN(proto::ExecutionPlan plan, DecodePlan(bytes, what));
  if (plan.job_id() != job || plan.iteration() != iteration || plan.rank() != rank) {
    return absl::DataLossError(absl::StrCat(what, ": the stored plan is job ", plan.job_id(), "'s, iteration ",
                                            plan.iteration(), " rank ", plan.rank(), " (moved from another key)"));
  }
  return plan;
}

RedisPlanStore::RedisPlanStore(RedisOptions options, std::string prefix)
    : options_(options), keys_(std::move(prefix)), client_(std::move(options)) {
  subscriber_ = std::thread([this] { SubscriberLoop(); });
}

RedisPlanStore::~RedisPlanStore() {
  Shutdown();
  subscriber_.join();
}

void RedisPlanStore::Shutdown() {
  stop_ = true;
  subscriber_socket_.Interrupt();
  client_.Shutdown();
}

absl::StatusOr<std::string> RedisPlanStore::CreateJob(const proto::JobSpec& spec, int64_t start_iteration,
                                                      int64_t now_ms) {
  if (start_iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("start_iteration: ", start_iteration, " is negative"));
  }
  ASSIGN_OR_RETURN(const RedisReply r,
                   client_.Command({"EVAL", kCreateScript, "4", keys_.JobCounter(), keys_.Jobs(), keys_.Events(),
                                    keys_.StoreId(), keys_.prefix(), spec.SerializeAsString(),
                                    std::to_string(proto::JobState::pending), std::to_string(now_ms),
                                    std::to_string(start_iteration), std::to_string(WorldSize(spec)),
                                    std::to_string(start_iteration - 1), NewStoreId()}));
  return r.str;
}

absl::StatusOr<std::string> RedisPlanStore::StoreId() {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"EVAL", kStoreIdScript, "1", keys_.StoreId(), NewStoreId()}));
  return r.str;
}

absl::StatusOr<proto::JobStatus> RedisPlanStore::GetJob(const std::string& job) {
  ASSIGN_OR_RETURN(const RedisReply spec, client_.Command({"GET", keys_.Spec(job)}));
  if (spec.is_nil()) return JobNotFound(job);
  proto::JobStatus status;
  status.set_job_id(job);
  if (!status.mutable_spec()->ParseFromString(spec.str)) return absl::DataLossError(absl::StrCat("job ", job, ": corrupt spec"));
  ASSIGN_OR_RETURN(const RedisReply st, client_.Command({"HMGET", keys_.State(job), "state", "error", "submit_ms",
                                                        "update_ms", "start_iteration"}));
  if (st.elements.size() == 5) {
    ASSIGN_OR_RETURN(const int64_t state, ParseInt(st.elements[0], 0));
    status.set_state(static_cast<proto::JobState::Value>(state));
    status.set_error(st.elements[1].str);
    ASSIGN_OR_RETURN(const int64_t submit, ParseInt(st.elements[2], 0));
    ASSIGN_OR_RETURN(const int64_t update, ParseInt(st.elements[3], 0));
    status.set_submit_time_unix_ms(submit);
    status.set_update_time_unix_ms(update);
    ASSIGN_OR_RETURN(const int64_t start, ParseInt(st.elements[4], 0));
    status.set_start_iteration(start);
  }
  ASSIGN_OR_RETURN(const RedisReply planned, client_.Command({"HGET", keys_.Progress(job), "planned"}));
  ASSIGN_OR_RETURN(const int64_t p, ParseInt(planned, -1));
  status.set_plans_ready(p);
  const int world = WorldSize(status.spec());
  ASSIGN_OR_RETURN(const auto done, DoneByRank(job, world));
  status.set_iterations_done(*std::min_element(done.begin(), done.end()) + 1);
  return status;
}

absl::StatusOr<std::vector<std::string>> RedisPlanStore::ListJobs() {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"SMEMBERS", keys_.Jobs()}));
  std::vector<std::string> out;
  for (const auto& e : r.elements) out.push_back(e.str);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<bool> RedisPlanStore::SetJobState(const std::string& job, proto::JobState::Value state,
                                                 const std::string& error, int64_t now_ms) {
  ASSIGN_OR_RETURN(const RedisReply r,
                   client_.Command({"EVAL", kStateScript, "2", keys_.State(job), keys_.Events(),
                                    std::to_string(state), error, std::to_string(now_ms), "job " + job}));
  return r.integer == 1;
}

absl::StatusOr<bool> RedisPlanStore::TryLease(const std::string& job, int64_t iteration, const std::string& owner,
                                              absl::Duration ttl) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"SET", keys_.Lease(job, iteration), owner, "NX", "PX", Ms(ttl)}));
  return !r.is_nil();
}

absl::Status RedisPlanStore::ReleaseLease(const std::string& job, int64_t iteration, const std::string& owner) {
  return client_.Command({"EVAL", kReleaseScript, "1", keys_.Lease(job, iteration), owner}).status();
}

absl::StatusOr<bool> RedisPlanStore::CommitPlans(const std::string& job, int64_t iteration, const std::string& owner,
                                                 std::span<const proto::ExecutionPlan> plans, absl::Duration ttl) {
  std::vector<std::string> args = {"EVAL", kCommitScript, std::to_string(4 + plans.size()),
                                   keys_.Lease(job, iteration), keys_.Planned(job, iteration), keys_.Progress(job),
                                   keys_.Events()};
  for (const auto& p : plans) args.push_back(keys_.Plan(job, iteration, p.rank()));
  args.push_back(owner);
  args.push_back(Ms(ttl));
  args.push_back(std::to_string(iteration));
  args.push_back(absl::StrCat("plan ", job, " ", iteration));
  for (const auto& p : plans) args.push_back(p.SerializeAsString());
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command(args));
  return r.integer == 1;
}

absl::StatusOr<bool> RedisPlanStore::IsPlanned(const std::string& job, int64_t iteration) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"EXISTS", keys_.Planned(job, iteration)}));
  return r.integer == 1;
}

absl::StatusOr<proto::ExecutionPlan> RedisPlanStore::GetPlan(const std::string& job, int64_t iteration, int rank) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.Plan(job, iteration, rank)}));
  if (r.is_nil()) {
    return absl::NotFoundError(absl::StrCat("plan of job ", job, " iteration ", iteration, " rank ", rank, " not stored"));
  }
  return DecodePlanFor(r.str, job, iteration, rank);
}

absl::StatusOr<int64_t> RedisPlanStore::PlanWrites(const std::string& job, int64_t iteration) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"HGET", keys_.Progress(job), absl::StrCat("writes:", iteration)}));
  return ParseInt(r, 0);
}

absl::Status RedisPlanStore::PutReport(const proto::IterationReport& report, absl::Duration ttl) {
  return client_
      .Command({"EVAL", kReportScript, "3", keys_.Metrics(report.job_id(), report.iteration(), report.rank()),
                keys_.Progress(report.job_id()), keys_.Events(), report.SerializeAsString(), Ms(ttl),
                std::to_string(report.rank()), std::to_string(report.iteration()), "job " + report.job_id()})
      .status();
}

absl::StatusOr<std::vector<int64_t>> RedisPlanStore::DoneByRank(const std::string& job, int world) {
  std::vector<std::string> args = {"HMGET", keys_.Progress(job)};
  for (int r = 0; r < world; ++r) args.push_back(absl::StrCat("done:", r));
  ASSIGN_OR_RETURN(const RedisReply reply, client_.Command(args));
  std::vector<int64_t> out;
  for (const auto& e : reply.elements) {
    ASSIGN_OR_RETURN(const int64_t v, ParseInt(e, -1));
    out.push_back(v);
  }
  out.resize(world, -1);
  return out;
}

absl::StatusOr<proto::IterationReport> RedisPlanStore::GetReport(const std::string& job, int64_t iteration, int rank) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.Metrics(job, iteration, rank)}));
  if (r.is_nil()) return absl::NotFoundError(absl::StrCat("no report for job ", job, " iteration ", iteration, " rank ", rank));
  proto::IterationReport report;
  if (!report.ParseFromString(r.str)) return absl::DataLossError("corrupt iteration report");
  return report;
}

absl::Status RedisPlanStore::PutHistory(const std::string& job, const proto::IterationSummary& summary) {
  return client_
      .Command({"EVAL", kHistoryScript, "1", keys_.History(job), std::to_string(summary.iteration()),
                summary.SerializeAsString(), std::to_string(kHistoryLimit)})
      .status();
}

absl::StatusOr<std::vector<proto::IterationSummary>> RedisPlanStore::History(const std::string& job, int64_t from,
                                                                             int limit) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"ZRANGEBYSCORE", keys_.History(job), std::to_string(from),
                                                        "+inf", "LIMIT", "0", std::to_string(limit)}));
  std::vector<proto::IterationSummary> out;
  for (const RedisReply& e : r.elements) {
    if (!out.emplace_back().ParseFromString(e.str)) {
      return absl::DataLossError(absl::StrCat("corrupt history entry of job ", job));
    }
  }
  return out;
}

absl::Status RedisPlanStore::AddFailure(const proto::IterationReport& report, absl::Duration ttl) {
  const std::string key = keys_.Failures(report.job_id());
  RETURN_IF_ERROR(client_.Command({"RPUSH", key, report.SerializeAsString()}).status());
  RETURN_IF_ERROR(client_.Command({"PEXPIRE", key, Ms(ttl)}).status());
  return client_.Command({"PUBLISH", keys_.Events(), "job " + report.job_id()}).status();
}

absl::StatusOr<std::vector<proto::IterationReport>> RedisPlanStore::Failures(const std::string& job) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"LRANGE", keys_.Failures(job), "0", "-1"}));
  std::vector<proto::IterationReport> out;
  for (const RedisReply& e : r.elements) {
    if (!out.emplace_back().ParseFromString(e.str)) {
      return absl::DataLossError(absl::StrCat("corrupt failure report of job ", job));
    }
  }
  return out;
}

absl::StatusOr<bool> RedisPlanStore::MarkCheckpointShard(const std::string& job, const std::string& checkpoint_dir,
                                                         int64_t iteration, int rank, int world) {
  RETURN_IF_ERROR(CheckShardMark(checkpoint_dir, iteration, rank, world));
  ASSIGN_OR_RETURN(const RedisReply r,
                   client_.Command({"EVAL", kMarkCheckpointScript, "2", keys_.CheckpointRanks(job, iteration),
                                    keys_.LatestCheckpoint(checkpoint_dir), std::to_string(rank),
                                    std::to_string(world), std::to_string(iteration)}));
  return r.integer == 1;
}

absl::StatusOr<int64_t> RedisPlanStore::LatestCheckpoint(const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.LatestCheckpoint(checkpoint_dir)}));
  return ParseInt(r, -1);
}

absl::StatusOr<bool> RedisPlanStore::ClaimGang(const std::string& job, const std::vector<std::string>& executors) {
  if (executors.empty()) return absl::InvalidArgumentError("executors: a gang needs at least one");
  const size_t n = executors.size();
  std::vector<std::string> args = {"EVAL", kGangScript, std::to_string(2 * n)};
  for (size_t r = 0; r < n; ++r) args.push_back(keys_.Rank(job, static_cast<int>(r)));
  for (const std::string& e : executors) args.push_back(keys_.Seat(e));
  args.push_back(job);
  for (const std::string& e : executors) args.push_back(e);
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command(args));
  return r.integer == 1;
}

absl::StatusOr<Seat> RedisPlanStore::SeatOf(const std::string& executor) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.Seat(executor)}));
  if (r.is_nil()) return Seat{};
  const size_t space = r.str.rfind(' ');
  Seat seat;
  if (space == std::string::npos || space == 0 || !absl::SimpleAtoi(r.str.substr(space + 1), &seat.rank)) {
    return absl::DataLossError(absl::StrCat("executor ", executor, ": corrupt seat record"));
  }
  seat.job = r.str.substr(0, space);
  return seat;
}

absl::Status RedisPlanStore::ReleaseSeat(const std::string& executor, const std::string& job) {
  return client_.Command({"EVAL", kReleaseSeatScript, "1", keys_.Seat(executor), job}).status();
}

absl::StatusOr<std::string> RedisPlanStore::RankHolder(const std::string& job, int rank) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.Rank(job, rank)}));
  return r.is_nil() ? std::string() : r.str;
}

absl::Status RedisPlanStore::PutExecutor(const proto::ExecutorRecord& record) {
  RETURN_IF_ERROR(client_.Command({"SET", keys_.Executor(record.executor_id()), record.SerializeAsString()}).status());
  return client_.Command({"SADD", keys_.Executors(), record.executor_id()}).status();
}

absl::StatusOr<proto::ExecutorRecord> RedisPlanStore::GetExecutor(const std::string& id) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.Executor(id)}));
  if (r.is_nil()) return absl::NotFoundError(absl::StrCat("executor ", id, " not registered"));
  proto::ExecutorRecord rec;
  if (!rec.ParseFromString(r.str)) return absl::DataLossError(absl::StrCat("executor ", id, ": corrupt record"));
  return rec;
}

absl::StatusOr<std::vector<std::string>> RedisPlanStore::ListExecutors() {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"SMEMBERS", keys_.Executors()}));
  std::vector<std::string> out;
  for (const auto& e : r.elements) out.push_back(e.str);
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status RedisPlanStore::DeleteExecutor(const std::string& id) {
  RETURN_IF_ERROR(client_.Command({"SREM", keys_.Executors(), id}).status());
  return client_.Command({"DEL", keys_.Executor(id), keys_.Seat(id)}).status();
}

absl::Status RedisPlanStore::SetBootstrap(const std::string& job, const std::string& key, const std::string& value) {
  RETURN_IF_ERROR(client_.Command({"SET", keys_.Bootstrap(job, key), value}).status());
  return client_.Command({"PUBLISH", keys_.Events(), absl::StrCat("bootstrap ", job, " ", key)}).status();
}

absl::StatusOr<std::string> RedisPlanStore::GetBootstrap(const std::string& job, const std::string& key) {
  ASSIGN_OR_RETURN(const RedisReply r, client_.Command({"GET", keys_.Bootstrap(job, key)}));
  if (r.is_nil()) return absl::NotFoundError(absl::StrCat("bootstrap key ", key, " of job ", job, " not set"));
  return r.str;
}

void RedisPlanStore::SetListener(std::function<void(const std::string& event)> listener) {
  MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

void RedisPlanStore::SubscriberLoop() {
  redisContext* ctx = nullptr;
  bool entered = false;  // ctx's socket is in subscriber_socket_
  auto free_ctx = [&] {
    if (ctx == nullptr) return;
    if (entered) subscriber_socket_.Leave(ctx->fd);
    entered = false;
    redisFree(ctx);
    ctx = nullptr;
  };
  absl::Duration backoff = options_.min_backoff;
  while (!stop_) {
    if (ctx == nullptr) {
      ctx = redisConnectWithTimeout(options_.host.c_str(), options_.port, absl::ToTimeval(options_.connect_timeout));
      bool ok = ctx != nullptr && !ctx->err;
      if (ok && !subscriber_socket_.Enter(ctx->fd)) break;  // shutting down
      entered = ok;
      if (ok) {
        // A stalled Redis must not block the handshake (or shutdown) forever.
        redisSetTimeout(ctx, absl::ToTimeval(options_.command_timeout));
        redisEnableKeepAlive(ctx);
      }
      if (ok && !options_.password.empty()) {
        auto* r = static_cast<redisReply*>(redisCommand(ctx, "AUTH %b", options_.password.data(), options_.password.size()));
        ok = r != nullptr && r->type != REDIS_REPLY_ERROR;
        if (r != nullptr) freeReplyObject(r);
      }
      if (ok) {
        const std::string channel = keys_.Events();
        auto* r = static_cast<redisReply*>(redisCommand(ctx, "SUBSCRIBE %b", channel.data(), channel.size()));
        ok = r != nullptr && r->type == REDIS_REPLY_ARRAY;
        if (r != nullptr) freeReplyObject(r);
      }
      if (!ok) {
        free_ctx();
        for (absl::Duration slept; slept < backoff && !stop_; slept += absl::Milliseconds(20)) absl::SleepFor(absl::Milliseconds(20));
        backoff = std::min(2 * backoff, options_.max_backoff);
        continue;
      }
      backoff = options_.min_backoff;
      // Events may have been missed while disconnected: wake everyone.
      MutexLock lock(&listener_mu_);
      if (listener_) listener_("reconnected");
    }
    void* reply = nullptr;
    if (redisGetReplyFromReader(ctx, &reply) != REDIS_OK) {
      free_ctx();
      continue;
    }
    if (reply == nullptr) {
      pollfd pfd{ctx->fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, 100);  // wake regularly to notice stop_
      if (ready > 0 && redisBufferRead(ctx) != REDIS_OK) free_ctx();
      continue;
    }
    auto* r = static_cast<redisReply*>(reply);
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[2]->type == REDIS_REPLY_STRING) {
      const std::string event(r->element[2]->str, r->element[2]->len);
      MutexLock lock(&listener_mu_);
      if (listener_) listener_(event);
    }
    freeReplyObject(r);
  }
  free_ctx();
}

}  // namespace dynapipe::store
