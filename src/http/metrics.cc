#include "src/http/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/build_info.h"

namespace dynapipe::http {

std::string RenderLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, labels[i].first, "=\"");
    for (char c : labels[i].second) {
      if (c == '\\') {
        out += "\\\\";
      } else if (c == '"') {
        out += "\\\"";
      } else if (c == '\n') {
        out += "\\n";
      } else {
        out += c;
      }
    }
    out += '"';
  }
  return out + "}";
}

Metrics::Series& Metrics::At(const std::string& name, Type type, const std::string& help, const Labels& labels) {
  Family& f = families_[name];
  if (f.series.empty()) f.type = type;
  if (!help.empty()) f.help = help;
  auto [it, added] = f.series.try_emplace(RenderLabels(labels));
  if (added) it->second.labels = labels;  // the key already says them
  return it->second;
}

void Metrics::Add(const std::string& name, double delta, const std::string& help, const Labels& labels) {
  MutexLock lock(&mu_);
  At(name, Type::kCounter, help, labels).value += delta;
}

void Metrics::SetTotal(const std::string& name, double total, const std::string& help, const Labels& labels) {
  MutexLock lock(&mu_);
  At(name, Type::kCounter, help, labels).value = total;
}

void Metrics::Set(const std::string& gauge, double value, const std::string& help, const Labels& labels) {
  MutexLock lock(&mu_);
  At(gauge, Type::kGauge, help, labels).value = value;
}

namespace {

template <typename SeriesMap>
void EraseMatching(SeriesMap& series, const Labels& match) {
  for (auto it = series.begin(); it != series.end();) {
    const Labels& have = it->second.labels;
    const bool all = std::all_of(match.begin(), match.end(), [&](const auto& m) {
      return std::find(have.begin(), have.end(), m) != have.end();
    });
    it = all ? series.erase(it) : std::next(it);
  }
}

}  // namespace

void Metrics::Clear(const std::string& name, const Labels& match) {
  MutexLock lock(&mu_);
  if (auto f = families_.find(name); f != families_.end()) EraseMatching(f->second.series, match);
}

void Metrics::ClearAll(const Labels& match) {
  MutexLock lock(&mu_);
  for (auto& [name, f] : families_) EraseMatching(f.series, match);
}

void Metrics::Observe(const std::string& name, double value, const std::vector<double>& buckets,
                      const std::string& help, const Labels& labels) {
  MutexLock lock(&mu_);
  Histogram& h = At(name, Type::kHistogram, help, labels).histogram;
  if (h.bounds.empty()) {
    h.bounds = buckets;
    h.counts.assign(buckets.size() + 1, 0);
  }
  const size_t i = std::lower_bound(h.bounds.begin(), h.bounds.end(), value) - h.bounds.begin();
  ++h.counts[i];
  h.sum += value;
  ++h.count;
}

namespace {

// The shortest text that reads back as `v` ("0.1", not "0.10000000000000001").
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) return absl::StrCat(static_cast<int64_t>(v));
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// A histogram series' labels with `le` added.
std::string WithLe(const Labels& labels, const std::string& le) {
  Labels l = labels;
  l.emplace_back("le", le);
  return RenderLabels(l);
}

}  // namespace

std::string Metrics::Render() const {
  MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (f.series.empty()) continue;
    if (!f.help.empty()) absl::StrAppendFormat(&out, "# HELP %s %s\n", name, f.help);
    const char* type = f.type == Type::kCounter ? "counter" : f.type == Type::kGauge ? "gauge" : "histogram";
    absl::StrAppendFormat(&out, "# TYPE %s %s\n", name, type);
    for (const auto& [labels, s] : f.series) {
      if (f.type != Type::kHistogram) {
        absl::StrAppend(&out, name, labels, " ", Number(s.value), "\n");
        continue;
      }
      const Histogram& h = s.histogram;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h.bounds.size(); ++i) {
        cumulative += h.counts[i];
        absl::StrAppend(&out, name, "_bucket", WithLe(s.labels, Number(h.bounds[i])), " ", cumulative, "\n");
      }
      cumulative += h.counts.back();
      absl::StrAppend(&out, name, "_bucket", WithLe(s.labels, "+Inf"), " ", cumulative, "\n", name, "_sum", labels, " ",
                      Number(h.sum), "\n", name, "_count", labels, " ", h.count, "\n");
    }
  }
  return out;
}

namespace {

// Fields of /proc/self/stat after the command name (field 3 onwards).
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double v = 0;
      in >> v;
      return v;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

}  // namespace

std::string ProcessMetricsText(const std::string& prefix) {
  std::string out;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    absl::StrAppendFormat(&out, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, type, name, Number(v));
  };
  const std::vector<std::string> f = StatFields();  // f[0] is field 3 (state)
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  if (f.size() > 21 && tick > 0) {
    one("process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.",
        (std::stod(f[11]) + std::stod(f[12])) / tick);
    one("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
        BootTimeSeconds() + std::stod(f[19]) / tick);
    one("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", std::stod(f[20]));
    one("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", std::stod(f[21]) * page);
  }
  if (const int fds = OpenFds(); fds >= 0) one("process_open_fds", "gauge", "Number of open file descriptors.", fds);
  if (rlimit r{}; getrlimit(RLIMIT_NOFILE, &r) == 0) {
    one("process_max_fds", "gauge", "Maximum number of open file descriptors.", static_cast<double>(r.rlim_cur));
  }
  const BuildInfo& b = GetBuildInfo();
  const std::string name = prefix + "_build_info";
  absl::StrAppendFormat(&out, "# HELP %s The binary's version, commit, build type and backends; always 1.\n", name);
  absl::StrAppendFormat(&out, "# TYPE %s gauge\n%s%s 1\n", name, name,
                        RenderLabels({{"version", b.version},
                                      {"commit", b.commit},
                                      {"build", b.build},
                                      {"cuda", b.cuda ? "true" : "false"}}));
  return out;
}

}  // namespace dynapipe::http
