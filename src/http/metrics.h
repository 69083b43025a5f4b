#pragma once

// A small metrics registry rendered in the Prometheus text format: counters,
// gauges and fixed-bucket histograms. Thread-safe.

#include <map>
#include <string>
#include <vector>

#include "src/common/mutex.h"

namespace dynapipe::http {

class Metrics {
 public:
  void Add(const std::string& counter, double delta = 1, const std::string& help = "");
  // `gauge` may carry Prometheus labels: "name{job=\"a\"}" (one HELP and
  // TYPE line per name).
  void Set(const std::string& gauge, double value, const std::string& help = "");
  // Drops every gauge of `name` whose labels contain `labels`.
  void Clear(const std::string& name, const std::string& labels);
  // Observes into histogram `name` with upper bounds `buckets` (fixed on first use).
  void Observe(const std::string& name, double value, const std::vector<double>& buckets, const std::string& help = "");
  // Prometheus exposition text (version 0.0.4).
  std::string Render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bound, non-cumulative; last = +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  mutable Mutex mu_;
  std::map<std::string, double> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Histogram> histograms_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> help_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::http
