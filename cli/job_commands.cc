#include "cli/job_commands.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proto/services.pb.h"
#include "cli/args.h"
#include "cli/trace.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"
#include "src/rpc/defaults.h"
#include "src/rpc/planner_client.h"
#include "src/spec/job_spec.h"
#include "src/spec/job_state.h"

namespace dynapipe::cli {
namespace {

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// "1:02:03"; "-" when not known.
std::string Clock(double seconds) {
  if (!(seconds > 0)) return "-";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
}

// One job, like a training log line: progress, loss (last and smoothed),
// time per iteration against the plan, throughput, elapsed, ETA, and why it
// waits or ended.
std::string Line(const proto::JobStatus& s) {
  const bool ended = spec::IsTerminal(s.state());
  const int64_t until = ended ? s.update_time_unix_ms() : absl::ToUnixMillis(absl::Now());
  std::string line = absl::StrFormat("%-20s %-16s %-9s iteration %d/%d", s.job_id(), s.spec().name(),
                                     proto::JobState::Value_Name(s.state()), s.iterations_done(), s.spec().iterations());
  if (s.iterations_done() > s.start_iteration()) {
    absl::StrAppendFormat(&line, " | loss %.4f (avg %.4f) | %.1f ms (planned %.1f) | %.0f tokens/s", s.last_loss(),
                          s.smoothed_loss(), s.last_iteration_ms(), s.predicted_iteration_ms(), s.tokens_per_second());
  } else {
    absl::StrAppendFormat(&line, " | plans ready to %d", s.plans_ready());
  }
  absl::StrAppend(&line, " | elapsed ", Clock((until - s.submit_time_unix_ms()) / 1e3));
  if (!ended) absl::StrAppend(&line, " | ETA ", Clock(s.eta_s()));
  if (!s.error().empty()) absl::StrAppend(&line, " | ", s.error());
  return line;
}

// What a status answer from the planner's last known state says about itself.
std::string StaleNote(int64_t stale_ms) {
  return absl::StrFormat("(the plan store (Redis) is not answering: this is the planner's last known state, %.1f s old)",
                         stale_ms / 1e3);
}

// Reports a failed command as one line on `err`; returns the exit status.
struct Failer {
  const std::string& command;
  std::ostream& err;
  int operator()(const absl::Status& s, int code) const {
    err << "dynapipe " << command << ": " << s.message() << "\n";
    return code;
  }
};

// What every subcommand works with: its parsed flags, positional arguments
// and the connected planner.
struct JobCall {
  const std::string& command;
  const Args& args;
  const std::vector<std::string>& pos;
  rpc::PlannerClient& client;
  bool json;
  std::ostream& out;
  const Failer& fail;
};

// "--flag value" pairs and positional arguments may interleave.
void SplitArgv(const std::vector<std::string>& argv, std::vector<std::string>* flag_args,
               std::vector<std::string>* pos) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) == 0) {
      flag_args->push_back(a);
      const bool has_value = a != "--json" && a != "--all" && a.find('=') == std::string::npos;
      if (has_value && i + 1 < argv.size()) flag_args->push_back(argv[++i]);
    } else {
      pos->push_back(a);
    }
  }
}

// The flags that take a value: the connection's, and the command's own.
std::set<std::string> ValuedFlags(const std::string& command) {
  std::set<std::string> valued = {"planner", "token-file", "timeout-s", "tls-ca"};
  if (command == "history") valued.insert({"from", "limit"});
  if (command == "trace") valued.insert({"iteration", "out"});
  if (command == "watch") valued.insert("grace-s");
  return valued;
}

// Connects to the planner named by the flags or the environment. Returns 0,
// or the exit status once the error is reported.
int ConnectFromArgs(const Args& args, const Failer& fail, std::unique_ptr<rpc::PlannerClient>* client) {
  rpc::PlannerClient::Options o;
  // Where each setting came from, for errors that say what to change.
  auto source = [&](const char* flag, const char* env) {
    return args.Has(flag) ? absl::StrCat("--", flag) : Env(env, "").empty() ? std::string() : absl::StrCat("$", env);
  };
  const std::string planner_from = source("planner", "DYNAPIPE_PLANNER");
  o.address = args.Str("planner", Env("DYNAPIPE_PLANNER", std::string(rpc::kDefaultPlannerAddress)));
  const std::string token_from = source("token-file", "DYNAPIPE_TOKEN_FILE");
  auto token = rpc::ReadToken(args.Str("token-file", Env("DYNAPIPE_TOKEN_FILE", "")));
  if (!token.ok()) return fail(Annotate(token.status(), token_from.empty() ? "--token-file" : token_from), 2);
  o.token = *token;
  o.tls.ca = args.Str("tls-ca");
  auto timeout = args.Int("timeout-s", kDefaultCallTimeoutS);
  if (!timeout.ok()) return fail(timeout.status(), 2);
  o.timeout = absl::Seconds(*timeout);
  o.connect_timeout = absl::Seconds(std::min<int64_t>(kConnectTimeoutS, std::max<int64_t>(1, *timeout)));
  auto connected = rpc::PlannerClient::Connect(o);
  if (!connected.ok()) {
    const std::string hint = planner_from.empty() ? std::string("the default address; set --planner or $DYNAPIPE_PLANNER")
                                                  : absl::StrCat("from ", planner_from);
    return fail(absl::Status(connected.status().code(), absl::StrCat(connected.status().message(), " (", hint, ")")),
                1);
  }
  *client = std::move(*connected);
  return 0;
}

int Submit(const JobCall& j) {
  if (j.pos.size() != 1) return j.fail(absl::InvalidArgumentError("usage: dynapipe submit JOB.pbtxt|JOB.json"), 2);
  proto::JobSpec spec;
  if (auto s = LoadProtoFile(j.pos[0], &spec); !s.ok()) return j.fail(s, 2);
  // Found here without a round trip; the planner checks again.
  if (auto n = spec::NormalizeJobSpec(spec); !n.ok()) return j.fail(Annotate(n.status(), j.pos[0]), 2);
  auto id = j.client.Submit(spec);
  if (!id.ok()) return j.fail(id.status(), 1);
  j.out << *id << "\n";
  return 0;
}

// `status JOB`: one job.
int StatusOfJob(const JobCall& j) {
  auto s = j.client.Get(j.pos[0]);
  if (!s.ok()) return j.fail(s.status(), 1);
  j.out << (j.json ? ToJson(*s) : Line(*s)) << "\n";
  if (!j.json && s->stale_ms() > 0) j.out << StaleNote(s->stale_ms()) << "\n";
  return 0;
}

// Drops the jobs that ended from `list`; returns how many.
int HideEndedJobs(proto::ListJobsResponse* list) {
  int hidden = 0;
  auto* jobs = list->mutable_jobs();
  for (int i = jobs->size() - 1; i >= 0; --i) {
    if (spec::IsTerminal(jobs->Get(i).state())) {
      jobs->DeleteSubrange(i, 1);
      ++hidden;
    }
  }
  return hidden;
}

// `status [JOB]` and `list`: one job, or every active one (--all: ended ones too).
int StatusOrList(const JobCall& j) {
  if (j.command == "status" && j.pos.size() == 1) return StatusOfJob(j);
  if (j.pos.size() > 1) {
    return j.fail(absl::InvalidArgumentError(j.command == "list" ? "usage: dynapipe list [--json] [--all]"
                                                                 : "usage: dynapipe status [JOB] [--json] [--all]"),
                  2);
  }
  auto list = j.client.List();
  if (!list.ok()) return j.fail(list.status(), 1);
  // Jobs that ended are left out unless --all.
  const int hidden = j.args.Has("all") ? 0 : HideEndedJobs(&*list);
  if (j.json) {
    j.out << ToJson(*list) << "\n";
    return 0;
  }
  for (const auto& s : list->jobs()) j.out << Line(s) << "\n";
  if (list->jobs().empty()) j.out << "no active jobs\n";
  if (hidden > 0) j.out << hidden << " ended job(s) not shown (--all shows them)\n";
  if (list->stale_ms() > 0) j.out << StaleNote(list->stale_ms()) << "\n";
  if (!list->notice().empty()) j.out << list->notice() << "\n";
  return 0;
}

int Cancel(const JobCall& j) {
  if (j.pos.size() != 1) return j.fail(absl::InvalidArgumentError("usage: dynapipe cancel JOB"), 2);
  if (auto s = j.client.Cancel(j.pos[0]); !s.ok()) return j.fail(s, 1);
  j.out << j.pos[0] << " cancelled\n";
  return 0;
}

// Megatron-LM's log line: iteration, lr, loss, grad norm, time, throughput.
std::string WatchLine(const proto::JobStatus& st, const std::string& state) {
  std::string line =
      absl::StrFormat("%s %s iteration %d/%d", st.job_id(), state, st.iterations_done(), st.spec().iterations());
  if (st.iterations_done() > st.start_iteration()) {
    absl::StrAppendFormat(&line, " | lr %.3e | loss %.4f (avg %.4f) | grad norm %.3f | %.1f ms (planned %.1f) | "
                          "%.0f tokens/s | ETA %s",
                          st.lr(), st.last_loss(), st.smoothed_loss(), st.grad_norm(), st.last_iteration_ms(),
                          st.predicted_iteration_ms(), st.tokens_per_second(), Clock(st.eta_s()));
  } else {
    absl::StrAppendFormat(&line, " | plans ready to %d", st.plans_ready());
  }
  if (!st.error().empty()) absl::StrAppend(&line, " | ", st.error());
  return line;
}

// A line per new iteration or state until the job ends; exit 0 only for a
// job that succeeded.
int Watch(const JobCall& j) {
  if (j.pos.size() != 1) return j.fail(absl::InvalidArgumentError("usage: dynapipe watch JOB"), 2);
  auto grace = j.args.Int("grace-s", rpc::kDefaultPlannerGraceS);
  if (!grace.ok()) return j.fail(grace.status(), 2);
  if (*grace < 0 || *grace > 86400) {
    return j.fail(absl::InvalidArgumentError(absl::StrCat("--grace-s: ", *grace, " is outside 0..86400")), 2);
  }
  int64_t last_done = -2;
  std::string last_state;
  proto::JobState::Value final_state = proto::JobState::unspecified;
  const absl::Status s = j.client.Watch(j.pos[0], [&](const proto::JobEvent& e) {
    const auto& st = e.status();
    final_state = st.state();
    const std::string state = proto::JobState::Value_Name(st.state());
    if (st.iterations_done() == last_done && state == last_state) return true;
    last_done = st.iterations_done();
    last_state = state;
    if (j.json) {
      j.out << ToJson(e) << "\n";
    } else {
      j.out << WatchLine(st, state) << std::endl;
    }
    return true;
  }, absl::Seconds(*grace));
  if (!s.ok()) return j.fail(s, 1);
  return final_state == proto::JobState::succeeded ? 0 : 1;
}

int History(const JobCall& j) {
  if (j.pos.size() != 1) {
    return j.fail(absl::InvalidArgumentError("usage: dynapipe history JOB [--from N] [--limit N]"), 2);
  }
  auto from = j.args.Int("from", 0);
  auto limit = j.args.Int("limit", 0);
  if (!from.ok()) return j.fail(from.status(), 2);
  if (!limit.ok()) return j.fail(limit.status(), 2);
  if (*limit < 0 || *limit > 100000) {
    return j.fail(absl::InvalidArgumentError(absl::StrCat("--limit: ", *limit, " is outside 0..100000")), 2);
  }
  auto h = j.client.GetIterations(j.pos[0], *from, static_cast<int>(*limit));
  if (!h.ok()) return j.fail(h.status(), 1);
  if (j.json) {
    j.out << ToJson(*h) << "\n";
    return 0;
  }
  for (const proto::IterationSummary& s : h->iterations()) {
    const double seconds = s.iteration_ms() / 1e3;
    j.out << absl::StrFormat(
        "iteration %6d | lr %.3e | loss %.4f | grad norm %.3f | %8.1f ms (planned %.1f) | %8.0f tokens/s | peak %.1f MB\n",
        s.iteration(), s.lr(), s.loss(), s.grad_norm(), s.iteration_ms(), s.predicted_iteration_ms(),
        seconds > 0 ? s.tokens() / seconds : 0.0, s.peak_memory_mb());
  }
  if (h->iterations().empty()) j.out << "no iterations completed from iteration " << *from << "\n";
  return 0;
}

int Trace(const JobCall& j) {
  if (j.pos.size() != 1 || !j.args.Has("iteration")) {
    return j.fail(absl::InvalidArgumentError("usage: dynapipe trace JOB --iteration N [--out FILE]"), 2);
  }
  auto iteration = j.args.Int("iteration", 0);
  if (!iteration.ok()) return j.fail(iteration.status(), 2);
  auto it = j.client.GetIteration(j.pos[0], *iteration);
  if (!it.ok()) return j.fail(it.status(), 1);
  std::string trace;
  TraceStats stats;
  if (auto s = IterationTrace(*it, &trace, &stats); !s.ok()) return j.fail(s, 1);
  const std::string path = j.args.Str("out", absl::StrCat(j.pos[0], "-iteration-", *iteration, ".trace.json"));
  if (auto s = WriteFileAtomic(path, trace); !s.ok()) return j.fail(Annotate(s, "--out"), 1);
  j.out << absl::StrFormat("wrote %s: iteration %d of %s, %d ranks, %d events, %d transfers (open it in Perfetto or "
                           "chrome://tracing)\n",
                           path, *iteration, j.pos[0], it->plans_size(), stats.events, stats.flows);
  return 0;
}

int Executors(const JobCall& j) {
  auto list = j.client.Executors();
  if (!list.ok()) return j.fail(list.status(), 1);
  if (j.json) {
    j.out << ToJson(*list) << "\n";
    return 0;
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (const auto& e : list->executors()) {
    j.out << absl::StrFormat("%-28s %-12s dev %-2d %-5s heartbeat %6.1fs ago %s\n", e.executor_id(), e.info().node(),
                             e.info().device_index(), e.lost() ? "LOST" : "ok", (now - e.last_heartbeat_unix_ms()) / 1e3,
                             e.assignment().job_id().empty()
                                 ? "idle"
                                 : absl::StrCat(e.assignment().job_id(), " rank ", e.assignment().rank()));
  }
  if (list->executors().empty()) j.out << "no executors\n";
  if (list->stale_ms() > 0) j.out << StaleNote(list->stale_ms()) << "\n";
  return 0;
}

using Subcommand = int (*)(const JobCall&);
constexpr std::pair<std::string_view, Subcommand> kSubcommands[] = {
    {"submit", Submit},   {"status", StatusOrList}, {"list", StatusOrList}, {"cancel", Cancel},
    {"watch", Watch},     {"history", History},     {"trace", Trace},       {"executors", Executors},
};

}  // namespace

int RunJobCommand(const std::string& command, const std::vector<std::string>& argv, std::ostream& out,
                  std::ostream& err) {
  const Failer fail{command, err};
  std::vector<std::string> flag_args;
  std::vector<std::string> pos;
  SplitArgv(argv, &flag_args, &pos);
  auto args = Args::Parse(flag_args, ValuedFlags(command), {"json", "all"});
  if (!args.ok()) return fail(args.status(), 2);
  std::unique_ptr<rpc::PlannerClient> client;
  if (const int code = ConnectFromArgs(*args, fail, &client); code != 0) return code;
  const JobCall call{command, *args, pos, *client, args->Has("json"), out, fail};
  for (const auto& [name, run] : kSubcommands) {
    if (name == command) return run(call);
  }
  return fail(absl::InvalidArgumentError("unknown command"), 2);
}

}  // namespace dynapipe::cli
