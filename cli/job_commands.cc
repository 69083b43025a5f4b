#include "cli/job_commands.h"

#include <cstdlib>
#include <ostream>
#include <set>

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

}  // namespace

int RunJobCommand(const std::string& command, const std::vector<std::string>& argv, std::ostream& out,
                  std::ostream& err) {
  auto fail = [&](const absl::Status& s, int code) {
    err << "dynapipe " << command << ": " << s.message() << "\n";
    return code;
  };
  // "--flag value" pairs and positional arguments may interleave.
  std::vector<std::string> flag_args;
  std::vector<std::string> pos;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) == 0) {
      flag_args.push_back(a);
      const bool has_value = a != "--json" && a != "--all" && a.find('=') == std::string::npos;
      if (has_value && i + 1 < argv.size()) flag_args.push_back(argv[++i]);
    } else {
      pos.push_back(a);
    }
  }
  std::set<std::string> valued = {"planner", "token-file", "timeout-s", "tls-ca"};
  if (command == "history") valued.insert({"from", "limit"});
  if (command == "trace") valued.insert({"iteration", "out"});
  if (command == "watch") valued.insert("grace-s");
  auto args = Args::Parse(flag_args, valued, {"json", "all"});
  if (!args.ok()) return fail(args.status(), 2);
  rpc::PlannerClient::Options o;
  // Where each setting came from, for errors that say what to change.
  auto source = [&](const char* flag, const char* env) {
    return args->Has(flag) ? absl::StrCat("--", flag) : Env(env, "").empty() ? std::string() : absl::StrCat("$", env);
  };
  const std::string planner_from = source("planner", "DYNAPIPE_PLANNER");
  o.address = args->Str("planner", Env("DYNAPIPE_PLANNER", std::string(rpc::kDefaultPlannerAddress)));
  const std::string token_from = source("token-file", "DYNAPIPE_TOKEN_FILE");
  auto token = rpc::ReadToken(args->Str("token-file", Env("DYNAPIPE_TOKEN_FILE", "")));
  if (!token.ok()) return fail(Annotate(token.status(), token_from.empty() ? "--token-file" : token_from), 2);
  o.token = *token;
  o.tls.ca = args->Str("tls-ca");
  auto timeout = args->Int("timeout-s", kDefaultCallTimeoutS);
  if (!timeout.ok()) return fail(timeout.status(), 2);
  o.timeout = absl::Seconds(*timeout);
  o.connect_timeout = absl::Seconds(std::min<int64_t>(kConnectTimeoutS, std::max<int64_t>(1, *timeout)));
  auto client = rpc::PlannerClient::Connect(o);
  if (!client.ok()) {
    const std::string hint = planner_from.empty() ? std::string("the default address; set --planner or $DYNAPIPE_PLANNER")
                                                  : absl::StrCat("from ", planner_from);
    return fail(absl::Status(client.status().code(), absl::StrCat(client.status().message(), " (", hint, ")")), 1);
  }
  rpc::PlannerClient& c = **client;
  const bool json = args->Has("json");

  if (command == "submit") {
    if (pos.size() != 1) return fail(absl::InvalidArgumentError("usage: dynapipe submit JOB.pbtxt|JOB.json"), 2);
    proto::JobSpec spec;
    if (auto s = LoadProtoFile(pos[0], &spec); !s.ok()) return fail(s, 2);
    // Found here without a round trip; the planner checks again.
    if (auto n = spec::NormalizeJobSpec(spec); !n.ok()) return fail(Annotate(n.status(), pos[0]), 2);
    auto id = c.Submit(spec);
    if (!id.ok()) return fail(id.status(), 1);
    out << *id << "\n";
    return 0;
  }
  if (command == "status" || command == "list") {
    if (command == "status" && pos.size() == 1) {
      auto s = c.Get(pos[0]);
      if (!s.ok()) return fail(s.status(), 1);
      out << (json ? ToJson(*s) : Line(*s)) << "\n";
      if (!json && s->stale_ms() > 0) out << StaleNote(s->stale_ms()) << "\n";
      return 0;
    }
    if (pos.size() > 1) {
      return fail(absl::InvalidArgumentError(command == "list" ? "usage: dynapipe list [--json] [--all]"
                                                               : "usage: dynapipe status [JOB] [--json] [--all]"),
                  2);
    }
    auto list = c.List();
    if (!list.ok()) return fail(list.status(), 1);
    // Jobs that ended are left out unless --all.
    int hidden = 0;
    if (!args->Has("all")) {
      auto* jobs = list->mutable_jobs();
      for (int i = jobs->size() - 1; i >= 0; --i) {
        if (spec::IsTerminal(jobs->Get(i).state())) {
          jobs->DeleteSubrange(i, 1);
          ++hidden;
        }
      }
    }
    if (json) {
      out << ToJson(*list) << "\n";
    } else {
      for (const auto& s : list->jobs()) out << Line(s) << "\n";
      if (list->jobs().empty()) out << "no active jobs\n";
      if (hidden > 0) out << hidden << " ended job(s) not shown (--all shows them)\n";
      if (list->stale_ms() > 0) out << StaleNote(list->stale_ms()) << "\n";
      if (!list->notice().empty()) out << list->notice() << "\n";
    }
    return 0;
  }
  if (command == "cancel") {
    if (pos.size() != 1) return fail(absl::InvalidArgumentError("usage: dynapipe cancel JOB"), 2);
    if (auto s = c.Cancel(pos[0]); !s.ok()) return fail(s, 1);
    out << pos[0] << " cancelled\n";
    return 0;
  }
  if (command == "watch") {
    if (pos.size() != 1) return fail(absl::InvalidArgumentError("usage: dynapipe watch JOB"), 2);
    auto grace = args->Int("grace-s", rpc::kDefaultPlannerGraceS);
    if (!grace.ok()) return fail(grace.status(), 2);
    if (*grace < 0 || *grace > 86400) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--grace-s: ", *grace, " is outside 0..86400")), 2);
    }
    int64_t last_done = -2;
    std::string last_state;
    proto::JobState::Value final_state = proto::JobState::unspecified;
    const absl::Status s = c.Watch(pos[0], [&](const proto::JobEvent& e) {
      const auto& st = e.status();
      final_state = st.state();
      const std::string state = proto::JobState::Value_Name(st.state());
      if (st.iterations_done() == last_done && state == last_state) return true;
      last_done = st.iterations_done();
      last_state = state;
      if (json) {
        out << ToJson(e) << "\n";
      } else {
        // Megatron-LM's log line: iteration, lr, loss, grad norm, time, throughput.
        std::string line = absl::StrFormat("%s %s iteration %d/%d", st.job_id(), state, st.iterations_done(),
                                           st.spec().iterations());
        if (st.iterations_done() > st.start_iteration()) {
          absl::StrAppendFormat(&line, " | lr %.3e | loss %.4f (avg %.4f) | grad norm %.3f | %.1f ms (planned %.1f) | "
                                "%.0f tokens/s | ETA %s",
                                st.lr(), st.last_loss(), st.smoothed_loss(), st.grad_norm(), st.last_iteration_ms(),
                                st.predicted_iteration_ms(), st.tokens_per_second(), Clock(st.eta_s()));
        } else {
          absl::StrAppendFormat(&line, " | plans ready to %d", st.plans_ready());
        }
        if (!st.error().empty()) absl::StrAppend(&line, " | ", st.error());
        out << line << std::endl;
      }
      return true;
    }, absl::Seconds(*grace));
    if (!s.ok()) return fail(s, 1);
    return final_state == proto::JobState::succeeded ? 0 : 1;
  }
  if (command == "history") {
    if (pos.size() != 1) return fail(absl::InvalidArgumentError("usage: dynapipe history JOB [--from N] [--limit N]"), 2);
    auto from = args->Int("from", 0);
    auto limit = args->Int("limit", 0);
    if (!from.ok()) return fail(from.status(), 2);
    if (!limit.ok()) return fail(limit.status(), 2);
    if (*limit < 0 || *limit > 100000) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--limit: ", *limit, " is outside 0..100000")), 2);
    }
    auto h = c.GetIterations(pos[0], *from, static_cast<int>(*limit));
    if (!h.ok()) return fail(h.status(), 1);
    if (json) {
      out << ToJson(*h) << "\n";
      return 0;
    }
    for (const proto::IterationSummary& s : h->iterations()) {
      const double seconds = s.iteration_ms() / 1e3;
      out << absl::StrFormat(
          "iteration %6d | lr %.3e | loss %.4f | grad norm %.3f | %8.1f ms (planned %.1f) | %8.0f tokens/s | peak %.1f MB\n",
          s.iteration(), s.lr(), s.loss(), s.grad_norm(), s.iteration_ms(), s.predicted_iteration_ms(),
          seconds > 0 ? s.tokens() / seconds : 0.0, s.peak_memory_mb());
    }
    if (h->iterations().empty()) out << "no iterations completed from iteration " << *from << "\n";
    return 0;
  }
  if (command == "trace") {
    if (pos.size() != 1 || !args->Has("iteration")) {
      return fail(absl::InvalidArgumentError("usage: dynapipe trace JOB --iteration N [--out FILE]"), 2);
    }
    auto iteration = args->Int("iteration", 0);
    if (!iteration.ok()) return fail(iteration.status(), 2);
    auto it = c.GetIteration(pos[0], *iteration);
    if (!it.ok()) return fail(it.status(), 1);
    std::string trace;
    TraceStats stats;
    if (auto s = IterationTrace(*it, &trace, &stats); !s.ok()) return fail(s, 1);
    const std::string path = args->Str("out", absl::StrCat(pos[0], "-iteration-", *iteration, ".trace.json"));
    if (auto s = WriteFileAtomic(path, trace); !s.ok()) return fail(Annotate(s, "--out"), 1);
    out << absl::StrFormat("wrote %s: iteration %d of %s, %d ranks, %d events, %d transfers (open it in Perfetto or "
                           "chrome://tracing)\n",
                           path, *iteration, pos[0], it->plans_size(), stats.events, stats.flows);
    return 0;
  }
  if (command == "executors") {
    auto list = c.Executors();
    if (!list.ok()) return fail(list.status(), 1);
    if (json) {
      out << ToJson(*list) << "\n";
      return 0;
    }
    const int64_t now = absl::ToUnixMillis(absl::Now());
    for (const auto& e : list->executors()) {
      out << absl::StrFormat("%-28s %-12s dev %-2d %-5s heartbeat %6.1fs ago %s\n", e.executor_id(), e.info().node(),
                             e.info().device_index(), e.lost() ? "LOST" : "ok", (now - e.last_heartbeat_unix_ms()) / 1e3,
                             e.assignment().job_id().empty() ? "idle"
                                                             : absl::StrCat(e.assignment().job_id(), " rank ", e.assignment().rank()));
    }
    if (list->executors().empty()) out << "no executors\n";
    if (list->stale_ms() > 0) out << StaleNote(list->stale_ms()) << "\n";
    return 0;
  }
  return fail(absl::InvalidArgumentError("unknown command"), 2);
}

}  // namespace dynapipe::cli
