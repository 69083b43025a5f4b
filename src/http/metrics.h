#pragma once

// A small metrics registry rendered in the Prometheus text format (0.0.4):
// counters, gauges and fixed-bucket histograms, each a family of series told
// apart by labels. Names follow Prometheus' conventions: base units
// (`_seconds`, `_bytes`), counters end in `_total`. Thread-safe.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/common/mutex.h"

namespace dynapipe::http {

// A series' labels, in the order given: {{"job", "a"}, {"rank", "0"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Metrics {
 public:
  // Adds `delta` to a counter.
  void Add(const std::string& name, double delta = 1, const std::string& help = "", const Labels& labels = {});
  // Sets a counter to a running total kept elsewhere (it must not go down).
  void SetTotal(const std::string& name, double total, const std::string& help = "", const Labels& labels = {});
  void Set(const std::string& gauge, double value, const std::string& help = "", const Labels& labels = {});
  // Drops every series of family `name` whose labels include all of `match`
  // (every series for an empty `match`).
  void Clear(const std::string& name, const Labels& match = {});
  // Drops every series of every family whose labels include all of `match`
  // (e.g. everything of a job that ended).
  void ClearAll(const Labels& match);
  // Observes into a histogram with upper bounds `buckets` (fixed on first use).
  void Observe(const std::string& name, double value, const std::vector<double>& buckets,
               const std::string& help = "", const Labels& labels = {});
  // The exposition text: every family with its HELP and TYPE lines.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bound, non-cumulative; last = +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  struct Series {
    Labels labels;
    double value = 0;
    Histogram histogram;
  };
  struct Family {
    Type type = Type::kGauge;
    std::string help;
    std::map<std::string, Series> series;  // by rendered labels
  };
  Series& At(const std::string& name, Type type, const std::string& help, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// `{a="x",b="y"}` with values escaped as the text format wants; "" for none.
std::string RenderLabels(const Labels& labels);

// The standard process series (process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes,
// process_start_time_seconds, process_open_fds, process_max_fds) of this
// process, read from /proc, and `<prefix>_build_info` with the version,
// commit, build type and CUDA labels, in exposition text.
std::string ProcessMetricsText(const std::string& prefix);

}  // namespace dynapipe::http
