#include "src/common/chrome_trace.h"

#include "src/common/json_writer.h"

namespace dynapipe {
namespace {

// Chrome's timestamps and durations: microseconds, to the nanosecond.
constexpr int kTimeDecimals = 3;
// Counter values (megabytes, rates): three decimals too.
constexpr int kValueDecimals = 3;

}  // namespace

ChromeTraceWriter::ChromeTraceWriter(std::string_view display_time_unit) : display_time_unit_(display_time_unit) {}

void ChromeTraceWriter::Append(const JsonWriter& event) {
  if (events_ > 0) events_json_ += ",\n";
  events_json_ += event.str();
  ++events_;
}

void ChromeTraceWriter::ProcessName(int pid, std::string_view name) {
  JsonWriter w;
  w.BeginObject().Str("ph", "M").Str("name", "process_name").Int("pid", pid);
  w.Key("args").BeginObject().Str("name", name).EndObject().EndObject();
  Append(w);
}

void ChromeTraceWriter::ProcessSortIndex(int pid, int64_t index) {
  JsonWriter w;
  w.BeginObject().Str("ph", "M").Str("name", "process_sort_index").Int("pid", pid);
  w.Key("args").BeginObject().Int("sort_index", index).EndObject().EndObject();
  Append(w);
}

void ChromeTraceWriter::ThreadName(int pid, int tid, std::string_view name) {
  JsonWriter w;
  w.BeginObject().Str("ph", "M").Str("name", "thread_name").Int("pid", pid).Int("tid", tid);
  w.Key("args").BeginObject().Str("name", name).EndObject().EndObject();
  Append(w);
}

void ChromeTraceWriter::Complete(std::string_view name, std::string_view cat, int pid, int tid, double ts_us,
                                 double dur_us, IntArgs args) {
  JsonWriter w;
  w.BeginObject().Str("ph", "X").Str("name", name);
  if (!cat.empty()) w.Str("cat", cat);
  w.Int("pid", pid).Int("tid", tid).Fixed("ts", ts_us, kTimeDecimals).Fixed("dur", dur_us, kTimeDecimals);
  if (!args.empty()) {
    w.Key("args").BeginObject();
    for (const auto& [key, value] : args) w.Int(key, value);
    w.EndObject();
  }
  w.EndObject();
  Append(w);
}

void ChromeTraceWriter::Counter(std::string_view name, int pid, double ts_us,
                                absl::Span<const std::pair<std::string_view, double>> values) {
  JsonWriter w;
  w.BeginObject().Str("ph", "C").Str("name", name).Int("pid", pid).Fixed("ts", ts_us, kTimeDecimals);
  w.Key("args").BeginObject();
  for (const auto& [series, value] : values) w.Fixed(series, value, kValueDecimals);
  w.EndObject().EndObject();
  Append(w);
}

void ChromeTraceWriter::FlowFields(int id, std::string_view name, std::string_view cat, int pid, int tid,
                                   double ts_us, JsonWriter& w) {
  w.Int("id", id).Str("name", name);
  if (!cat.empty()) w.Str("cat", cat);
  w.Int("pid", pid).Int("tid", tid).Fixed("ts", ts_us, kTimeDecimals);
}

void ChromeTraceWriter::FlowStart(int id, std::string_view name, std::string_view cat, int pid, int tid,
                                  double ts_us) {
  JsonWriter w;
  w.BeginObject().Str("ph", "s");
  FlowFields(id, name, cat, pid, tid, ts_us, w);
  w.EndObject();
  Append(w);
}

void ChromeTraceWriter::FlowEnd(int id, std::string_view name, std::string_view cat, int pid, int tid, double ts_us) {
  JsonWriter w;
  w.BeginObject().Str("ph", "f").Str("bp", "e");
  FlowFields(id, name, cat, pid, tid, ts_us, w);
  w.EndObject();
  Append(w);
}

std::string ChromeTraceWriter::Finish() const {
  JsonWriter w;
  w.BeginObject();
  if (!display_time_unit_.empty()) w.Str("displayTimeUnit", display_time_unit_);
  // The events' array by hand: one event per line, which diffs and greps read.
  w.Key("traceEvents").Raw("[\n" + events_json_ + "\n]");
  w.EndObject();
  return w.Take() + "\n";
}

}  // namespace dynapipe
