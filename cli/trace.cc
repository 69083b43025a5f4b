#include "cli/trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/struct.pb.h"
#include "planner/plan/transfers.h"
#include "src/common/chrome_trace.h"
#include "src/common/proto_io.h"

namespace dynapipe::cli {
namespace {

// Tracks of a rank.
enum Track { kMeasuredCompute = 1, kMeasuredComm = 2, kPlannedCompute = 3, kPlannedComm = 4 };
constexpr const char* kTrackNames[] = {"", "measured: compute", "measured: communication", "planned: compute",
                                       "planned: communication"};

// The instruction's name and whether it is communication.
struct OpInfo {
  std::string name;
  bool comm = false;
};

OpInfo Describe(const proto::Instruction& ins) {
  using I = proto::Instruction;
  switch (ins.op_case()) {
    case I::kLoadInput: return {"load input"};
    case I::kForward: return {"forward"};
    case I::kBackward: return {"backward"};
    case I::kSendActivationStart: return {"send activation", true};
    case I::kSendActivationFinish: return {"send activation (wait)", true};
    case I::kRecvActivationStart: return {"receive activation", true};
    case I::kRecvActivationFinish: return {"receive activation (wait)", true};
    case I::kSendGradStart: return {"send gradient", true};
    case I::kSendGradFinish: return {"send gradient (wait)", true};
    case I::kRecvGradStart: return {"receive gradient", true};
    case I::kRecvGradFinish: return {"receive gradient (wait)", true};
    case I::kFreeBuffer: return {"free buffer"};
    case I::kAllReduceGrads: return {"all-reduce gradients", true};
    case I::kOptimizerStep: return {"optimizer step"};
    case I::OP_NOT_SET: break;
  }
  return {"unknown"};
}

// Microseconds from milliseconds; 0 for what is not a time (NaN, negative).
double Us(double ms) { return std::isfinite(ms) && ms > 0 ? ms * 1e3 : 0.0; }

// A slice of an instruction on track `tid` of rank `pid`, at least 1 us long.
void Slice(const std::string& name, int pid, int tid, double start_ms, double end_ms, int index, int mb,
           ChromeTraceWriter* trace) {
  const double ts = Us(start_ms), dur = std::max(1.0, Us(end_ms) - ts);
  const std::pair<std::string_view, int64_t> args[] = {{"instruction", index}, {"micro_batch", mb}};
  trace->Complete(mb >= 0 ? absl::StrCat(name, " mb ", mb) : name,
                  tid == kMeasuredCompute || tid == kPlannedCompute ? "compute" : "communication", pid, tid, ts, dur,
                  ChromeTraceWriter::IntArgs(args, mb >= 0 ? 2 : 1));
}

// Where each measured instruction of a rank ran: instruction -> (start, end).
using MeasuredTimes = std::map<int, std::pair<double, double>>;

// The names and order of rank r's process and tracks.
void AppendRankNames(const proto::ExecutionPlan& plan, int r, ChromeTraceWriter* trace) {
  trace->ProcessName(r, absl::StrFormat("rank %d (stage %d, group %d)", r, plan.pp_rank(), plan.dp_rank()));
  trace->ProcessSortIndex(r, r);
  for (int t = kMeasuredCompute; t <= kPlannedComm; ++t) trace->ThreadName(r, t, kTrackNames[t]);
}

// Rank r's planned slices, then its measured ones (noted in `measured`).
absl::Status AppendRankSlices(const proto::ExecutionPlan& plan, const proto::IterationReport& report, int r,
                              ChromeTraceWriter* trace, MeasuredTimes* measured) {
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const proto::Instruction& ins = plan.instructions(i);
    const OpInfo op = Describe(ins);
    Slice(op.name, r, op.comm ? kPlannedComm : kPlannedCompute, ins.sim_start_ms(), ins.sim_end_ms(), i,
          ins.micro_batch(), trace);
  }
  for (const proto::InstructionTiming& t : report.timings()) {
    if (t.index() < 0 || t.index() >= plan.instructions_size()) {
      return absl::InvalidArgumentError(absl::StrCat("trace: rank ", r, " timed instruction ", t.index(),
                                                     " of a plan with ", plan.instructions_size(), " instructions"));
    }
    const proto::Instruction& ins = plan.instructions(t.index());
    const OpInfo op = Describe(ins);
    Slice(op.name, r, op.comm ? kMeasuredComm : kMeasuredCompute, t.start_ms(), t.end_ms(), t.index(),
          ins.micro_batch(), trace);
    (*measured)[t.index()] = {t.start_ms(), t.end_ms()};
  }
  return absl::OkStatus();
}

// Rank r's measured and planned peak memory, at the start and the end of the iteration.
void AppendMemoryCounters(const proto::ExecutionPlan& plan, const proto::IterationReport& report, int r,
                          ChromeTraceWriter* trace) {
  const double end_us = std::max(1.0, Us(report.iteration_ms()));
  const double measured = std::isfinite(report.peak_memory_mb()) ? report.peak_memory_mb() : 0.0;
  const double planned = std::isfinite(plan.predicted_peak_memory_mb()) ? plan.predicted_peak_memory_mb() : 0.0;
  for (double ts : {0.0, end_us}) {
    trace->Counter("peak memory (MB)", r, ts, {{"measured", measured}, {"planned", planned}});
  }
}

// Flows: the k-th measured send of a kind from a to b for a micro-batch
// meets the k-th receive (its wait) at b from a of that kind and
// micro-batch. Returns how many arrows were drawn.
int AppendFlows(const proto::GetIterationResponse& it, const std::vector<MeasuredTimes>& measured,
                ChromeTraceWriter* trace) {
  const int world = it.plans_size();
  std::map<planner::TransferKey, std::vector<int>> sends, recvs;  // -> instruction indices, in plan order
  for (int r = 0; r < world; ++r) {
    const proto::ExecutionPlan& plan = it.plans(r);
    for (int i = 0; i < plan.instructions_size(); ++i) {
      const std::optional<planner::TransferOp> x = planner::TransferOf(plan.instructions(i), r);
      if (x && x->step == planner::TransferStep::kSendStart) sends[x->key].push_back(i);
      if (x && x->step == planner::TransferStep::kRecvFinish) recvs[x->key].push_back(i);
    }
  }
  int flow = 0;
  for (const auto& [key, from] : sends) {
    const auto& [activation, a, b, mb] = key;
    auto to = recvs.find(key);
    if (to == recvs.end() || a < 0 || a >= world || b < 0 || b >= world) continue;
    for (size_t k = 0; k < std::min(from.size(), to->second.size()); ++k) {
      auto s = measured[a].find(from[k]);
      auto f = measured[b].find(to->second[k]);
      if (s == measured[a].end() || f == measured[b].end()) continue;  // not timed: no arrow
      ++flow;
      const std::string name = absl::StrCat(activation ? "activation" : "gradient", " mb ", mb);
      // Each end sits inside its slice, which it binds to.
      const double s_ts = Us(s->second.first) + 0.25;
      const double f_ts = Us(f->second.first) + 0.25;
      trace->FlowStart(flow, name, "transfer", a, kMeasuredComm, s_ts);
      trace->FlowEnd(flow, name, "transfer", b, kMeasuredComm, f_ts);
    }
  }
  return flow;
}

using JsonFields = google::protobuf::Map<std::string, google::protobuf::Value>;

// Field k of an event when it has the given kind, else null.
const google::protobuf::Value* FieldOf(const JsonFields& e, const char* k, google::protobuf::Value::KindCase kind) {
  auto it = e.find(k);
  return it != e.end() && it->second.kind_case() == kind ? &it->second : nullptr;
}

// What CheckTrace gathers over the events, checked once all are seen.
struct TraceNames {
  std::set<int> named_pids, used_pids;
  std::set<std::pair<int, int>> named_threads, used_threads;
  std::map<std::string, std::pair<int, int>> flows;  // id -> (starts, ends)
};

absl::Status CheckCounter(const std::string& where, const JsonFields& e) {
  auto args = e.find("args");
  if (args == e.end() || !args->second.has_struct_value() || args->second.struct_value().fields().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a counter needs values in args"));
  }
  for (const auto& [k, val] : args->second.struct_value().fields()) {
    if (val.kind_case() != google::protobuf::Value::kNumberValue) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": counter value ", k, " is not a number"));
    }
  }
  return absl::OkStatus();
}

// One event's own checks; the names it gives or uses go to `names`.
absl::Status CheckEvent(const google::protobuf::Value& v, const std::string& where, TraceNames* names) {
  using google::protobuf::Value;
  if (!v.has_struct_value()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  const JsonFields& e = v.struct_value().fields();
  const auto* ph = FieldOf(e, "ph", Value::kStringValue);
  const auto* name = FieldOf(e, "name", Value::kStringValue);
  const auto* pid = FieldOf(e, "pid", Value::kNumberValue);
  if (ph == nullptr || name == nullptr || pid == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": needs string ph and name and a numeric pid"));
  }
  const std::string& phase = ph->string_value();
  const int p = static_cast<int>(pid->number_value());
  const auto* tid = FieldOf(e, "tid", Value::kNumberValue);
  if (phase == "M") {
    auto args = e.find("args");
    const bool has_name =
        args != e.end() && args->second.has_struct_value() && args->second.struct_value().fields().contains("name");
    if (name->string_value() == "process_name" && has_name) names->named_pids.insert(p);
    if (name->string_value() == "thread_name" && has_name && tid != nullptr) {
      names->named_threads.insert({p, static_cast<int>(tid->number_value())});
    }
    return absl::OkStatus();
  }
  const auto* ts = FieldOf(e, "ts", Value::kNumberValue);
  if (ts == nullptr || ts->number_value() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": bad ts"));
  names->used_pids.insert(p);
  if (phase == "C") return CheckCounter(where, e);
  if (tid == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": no tid"));
  names->used_threads.insert({p, static_cast<int>(tid->number_value())});
  if (phase == "X") {
    const auto* dur = FieldOf(e, "dur", Value::kNumberValue);
    if (dur == nullptr || dur->number_value() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": bad dur"));
  } else if (phase == "s" || phase == "f") {
    const auto* id = FieldOf(e, "id", Value::kNumberValue);
    if (id == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": a flow needs an id"));
    auto& n = names->flows[absl::StrCat(id->number_value())];
    ++(phase == "s" ? n.first : n.second);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unexpected phase ", phase));
  }
  return absl::OkStatus();
}

// Every flow paired, every process and thread used named.
absl::Status CheckNames(const TraceNames& names) {
  for (const auto& [id, n] : names.flows) {
    if (n.first != 1 || n.second != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace: flow ", id, " has ", n.first, " start(s) and ", n.second, " end(s)"));
    }
  }
  for (int p : names.used_pids) {
    if (!names.named_pids.contains(p)) {
      return absl::InvalidArgumentError(absl::StrCat("trace: process ", p, " has no name"));
    }
  }
  for (const auto& [p, t] : names.used_threads) {
    if (!names.named_threads.contains({p, t})) {
      return absl::InvalidArgumentError(absl::StrCat("trace: thread ", t, " of process ", p, " has no name"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status IterationTrace(const proto::GetIterationResponse& it, std::string* json, TraceStats* stats) {
  const int world = it.plans_size();
  if (world == 0 || it.reports_size() != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace: ", it.plans_size(), " plans and ", it.reports_size(), " reports"));
  }
  ChromeTraceWriter trace(/*display_time_unit=*/"ms");
  std::vector<MeasuredTimes> measured(world);  // by rank
  for (int r = 0; r < world; ++r) {
    const proto::ExecutionPlan& plan = it.plans(r);
    const proto::IterationReport& report = it.reports(r);
    if (plan.rank() != r || report.rank() != r) {
      return absl::InvalidArgumentError(absl::StrCat("trace: entry ", r, " holds the plan of rank ", plan.rank(),
                                                     " and the report of rank ", report.rank()));
    }
    AppendRankNames(plan, r, &trace);
    if (absl::Status s = AppendRankSlices(plan, report, r, &trace, &measured[r]); !s.ok()) return s;
    AppendMemoryCounters(plan, report, r, &trace);
  }
  const int flow = AppendFlows(it, measured, &trace);
  *json = trace.Finish();
  if (stats != nullptr) *stats = {trace.events(), flow};
  return absl::OkStatus();
}

absl::Status CheckTrace(const std::string& json) {
  google::protobuf::Struct root;
  if (absl::Status s = ParseJsonProto(json, "trace", &root); !s.ok()) return s;
  auto f = root.fields().find("traceEvents");
  if (f == root.fields().end() || !f->second.has_list_value()) {
    return absl::InvalidArgumentError("trace: no traceEvents array");
  }
  TraceNames names;
  int index = 0;
  for (const google::protobuf::Value& v : f->second.list_value().values()) {
    const std::string where = absl::StrCat("trace event ", index++);
    if (absl::Status s = CheckEvent(v, where, &names); !s.ok()) return s;
  }
  return CheckNames(names);
}

}  // namespace dynapipe::cli
