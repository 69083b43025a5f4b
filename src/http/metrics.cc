#include "src/http/metrics.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_format.h"

namespace dynapipe::http {

void Metrics::Add(const std::string& counter, double delta, const std::string& help) {
  MutexLock lock(&mu_);
  counters_[counter] += delta;
  if (!help.empty()) help_[counter] = help;
}

namespace {

std::string BaseName(const std::string& name) { return name.substr(0, name.find('{')); }

}  // namespace

void Metrics::Set(const std::string& gauge, double value, const std::string& help) {
  MutexLock lock(&mu_);
  gauges_[gauge] = value;
  if (!help.empty()) help_[BaseName(gauge)] = help;
}

void Metrics::Clear(const std::string& name, const std::string& labels) {
  MutexLock lock(&mu_);
  for (auto it = gauges_.begin(); it != gauges_.end();) {
    const bool match = BaseName(it->first) == name && it->first.find(labels) != std::string::npos;
    it = match ? gauges_.erase(it) : std::next(it);
  }
}

void Metrics::Observe(const std::string& name, double value, const std::vector<double>& buckets, const std::string& help) {
  MutexLock lock(&mu_);
  Histogram& h = histograms_[name];
  if (h.bounds.empty()) {
    h.bounds = buckets;
    h.counts.assign(buckets.size() + 1, 0);
  }
  const size_t i = std::lower_bound(h.bounds.begin(), h.bounds.end(), value) - h.bounds.begin();
  ++h.counts[i];
  h.sum += value;
  ++h.count;
  if (!help.empty()) help_[name] = help;
}

std::string Metrics::Render() const {
  MutexLock lock(&mu_);
  std::string out;
  auto header = [&](const std::string& name, const char* type) {
    auto it = help_.find(name);
    if (it != help_.end()) absl::StrAppendFormat(&out, "# HELP %s %s\n", name, it->second);
    absl::StrAppendFormat(&out, "# TYPE %s %s\n", name, type);
  };
  for (const auto& [name, v] : counters_) {
    header(name, "counter");
    absl::StrAppendFormat(&out, "%s %.17g\n", name, v);
  }
  std::string last_base;
  for (const auto& [name, v] : gauges_) {
    if (const std::string base = BaseName(name); base != last_base) {
      header(base, "gauge");
      last_base = base;
    }
    absl::StrAppendFormat(&out, "%s %.17g\n", name, v);
  }
  for (const auto& [name, h] : histograms_) {
    header(name, "histogram");
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      absl::StrAppendFormat(&out, "%s_bucket{le=\"%.17g\"} %d\n", name, h.bounds[i], cumulative);
    }
    cumulative += h.counts.back();
    absl::StrAppendFormat(&out, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %.17g\n%s_count %d\n", name, cumulative, name, h.sum,
                          name, h.count);
  }
  return out;
}

}  // namespace dynapipe::http
