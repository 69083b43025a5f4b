#include "src/data/lengths.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::data {

absl::StatusOr<std::vector<RawLength>> ParseLengths(const std::string& text, const std::string& source) {
  std::vector<RawLength> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t,"), absl::SkipEmpty());
    if (fields.size() > 2) {
      // Never the line itself: the file may not be what the caller may read.
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": expected \"input_len [target_len]\", got ",
                                                     fields.size(), " fields"));
    }
    int64_t v[2] = {0, 0};
    for (size_t i = 0; i < fields.size(); ++i) {
      if (!absl::SimpleAtoi(fields[i], &v[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", line_no, ": field ", i + 1, " is not a whole number"));
      }
    }
    if (v[0] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": the input length must be positive"));
    }
    if (v[1] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": the target length is negative"));
    }
    out.push_back({v[0], v[1]});
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no samples"));
  return out;
}

absl::StatusOr<std::vector<RawLength>> ReadLengthsFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return ParseLengths(text, path);
}

}  // namespace dynapipe::data
