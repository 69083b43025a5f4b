#pragma once

// Minimal "--name value" / "--name=value" / "--switch" parsing for the
// dynapipe subcommands. Unknown flags and missing values are errors. Names
// are dashed (--token-file); underscores are accepted as dashes.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::cli {

class Args {
 public:
  // `valued` flags take a value; `switches` do not.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv, const std::set<std::string>& valued,
                                    const std::set<std::string>& switches);

  bool Has(const std::string& name) const { return values_.contains(name); }
  std::string Str(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;
  // Comma-separated integers.
  absl::StatusOr<std::vector<int>> IntList(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace dynapipe::cli
