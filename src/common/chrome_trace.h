#pragma once

// Chrome trace-event JSON (what Perfetto and chrome://tracing open), written
// through JsonWriter: one event per line, "ph" its first key, times in
// microseconds with three decimals. Only the phases our traces use: complete
// slices ("X"), counters ("C"), flow arrows ("s"/"f") and process/thread
// metadata ("M").
//
//   ChromeTraceWriter t;
//   t.ProcessName(0, "device 0");
//   t.Complete("F0", /*cat=*/"", /*pid=*/0, /*tid=*/0, /*ts_us=*/0, /*dur_us=*/12.5);
//   t.Finish()  // {"traceEvents":[\n{"ph":"M",...},\n{"ph":"X",...}\n]}\n

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/types/span.h"

namespace dynapipe {

class JsonWriter;

class ChromeTraceWriter {
 public:
  // Integer arguments of a slice, shown with it in the viewer.
  using IntArgs = absl::Span<const std::pair<std::string_view, int64_t>>;

  // `display_time_unit` ("ms", "ns"): the viewer's unit; empty: the default.
  explicit ChromeTraceWriter(std::string_view display_time_unit = "");

  // Metadata: a process's name, its place among processes, a thread's name.
  void ProcessName(int pid, std::string_view name);
  void ProcessSortIndex(int pid, int64_t index);
  void ThreadName(int pid, int tid, std::string_view name);
  // A complete ("X") event: a slice of thread `tid` of process `pid`; no
  // "cat" when `cat` is empty, no "args" when `args` is.
  void Complete(std::string_view name, std::string_view cat, int pid, int tid, double ts_us, double dur_us,
                IntArgs args = {});
  // A counter ("C") sample: each value a series of the counter `name`.
  void Counter(std::string_view name, int pid, double ts_us,
               absl::Span<const std::pair<std::string_view, double>> values);
  // A flow arrow's start ("s") and its end ("f", bound to the enclosing
  // slice); the two share `id`.
  void FlowStart(int id, std::string_view name, std::string_view cat, int pid, int tid, double ts_us);
  void FlowEnd(int id, std::string_view name, std::string_view cat, int pid, int tid, double ts_us);

  // Events written so far.
  int events() const { return events_; }
  // The whole document, newline-terminated.
  std::string Finish() const;

 private:
  // Appends a finished event object.
  void Append(const JsonWriter& event);
  // A flow point's fields after its phase.
  static void FlowFields(int id, std::string_view name, std::string_view cat, int pid, int tid, double ts_us,
                         JsonWriter& w);

  std::string display_time_unit_;
  std::string events_json_;  // the events, one per line, comma-separated
  int events_ = 0;
};

}  // namespace dynapipe
