#include "cli/args.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dynapipe::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv, const std::set<std::string>& valued,
                                 const std::set<std::string>& switches) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    // One style, dashes; the underscore spellings are aliases.
    std::replace(name.begin(), name.end(), '_', '-');
    if (switches.contains(name)) {
      if (inline_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      a.values_[name] = "true";
    } else if (valued.contains(name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      a.values_[name] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return a;
}

std::string Args::Str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::Int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": \"", it->second, "\" is not a whole number"));
  }
  return v;
}

absl::StatusOr<double> Args::Double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": \"", it->second, "\" is not a number"));
  }
  return v;
}

absl::StatusOr<std::vector<int>> Args::IntList(const std::string& name) const {
  std::vector<int> out;
  auto it = values_.find(name);
  if (it == values_.end()) return out;
  for (absl::string_view part : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": \"", part, "\" is not a whole number"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace dynapipe::cli
