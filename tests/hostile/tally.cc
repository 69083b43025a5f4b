#include "tests/hostile/tally.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace dynapipe::testing::hostile {

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kRefused:
      return "refused";
    case Outcome::kAccepted:
      return "ACCEPTED";
    case Outcome::kHang:
      return "HANG";
    case Outcome::kCrash:
      return "CRASH";
  }
  return "?";
}

Tally::Tally(std::vector<std::pair<std::string, std::string>> redactions) : redactions_(std::move(redactions)) {
  // Longest first, so that a path is replaced before a prefix of it.
  std::sort(redactions_.begin(), redactions_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::string Tally::Clean(std::string text, size_t limit) const {
  text = std::string(absl::StripTrailingAsciiWhitespace(text));
  for (const auto& [from, to] : redactions_) {
    if (!from.empty()) text = absl::StrReplaceAll(text, {{from, to}});
  }
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      // A well-formed UTF-8 sequence stays; any other byte is escaped (the table must be UTF-8).
      const size_t n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      bool valid = n > 0 && i + n <= text.size();
      for (size_t k = 1; valid && k < n; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
      if (valid) {
        out.append(text, i, n);
        i += n - 1;
      } else {
        out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
      }
    } else if (c == '\n') {
      out += " / ";
    } else if (c == '|') {
      out += "\\|";
    } else if (c == '`') {
      out += "'";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
    if (out.size() > limit) {
      out.resize(limit);
      // Not in the middle of a UTF-8 sequence.
      while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xc0) == 0x80) out.pop_back();
      if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xc0) out.pop_back();
      out += " ...";
      break;
    }
  }
  return std::string(absl::StripAsciiWhitespace(out));
}

Tally::Surface& Tally::Find(const std::string& name) {
  for (Surface& s : surfaces_) {
    if (s.name == name) return s;
  }
  Surface& s = surfaces_.emplace_back();
  s.name = name;
  return s;
}

void Tally::Add(const std::string& surface, const std::string& input, const Result& r) {
  if (verbose_ || r.outcome != Outcome::kRefused) {
    std::printf("hostile: %s | %s | %s | %s\n", surface.c_str(), Clean(input, 100).c_str(), OutcomeName(r.outcome),
                Clean(absl::StrCat(r.code, ": ", r.message), 200).c_str());
    std::fflush(stdout);
  }
  if (!secret_.empty() && r.message.find(secret_) != std::string::npos) {
    ++leaks_;
    failures_.push_back(absl::StrCat(surface, " | ", Clean(input, 120), " | LEAK | the message shows the API token"));
  }
  Surface& s = Find(surface);
  ++s.counts[static_cast<int>(r.outcome)];
  if (!r.code.empty()) ++s.codes[r.code];
  if (r.outcome == Outcome::kRefused) {
    const absl::string_view m = absl::StripTrailingAsciiWhitespace(r.message);
    const bool one_line = !m.empty() && m.find('\n') == absl::string_view::npos;
    if (one_line) ++s.one_line;
    if (s.example.empty()) s.example = Clean(r.message, 200);
    if (!one_line || r.code == "UNAVAILABLE") {
      notes_[surface].push_back(absl::StrCat(Clean(input, 100), " → ", Clean(r.code, 40),
                                             m.empty() ? " (no message)"
                                                       : absl::StrCat(one_line ? "" : " (several lines)", ": `",
                                                                      Clean(r.message, 160), "`")));
    }
  } else {
    failures_.push_back(absl::StrCat(surface, " | ", Clean(input, 120), " | ", OutcomeName(r.outcome), " | ",
                                     Clean(absl::StrCat(r.code, ": ", r.message), 300)));
  }
}

void Tally::AddControl(const std::string& surface, const std::string& input, bool accepted,
                       const std::string& detail) {
  controls_.push_back({surface, input, detail, accepted});
  if (!accepted) {
    failures_.push_back(absl::StrCat(surface, " | control ", Clean(input, 120), " | not accepted | ",
                                     Clean(detail, 300)));
  }
}

int Tally::inputs() const {
  int n = 0;
  for (const Surface& s : surfaces_) n += s.counts[0] + s.counts[1] + s.counts[2] + s.counts[3];
  return n;
}

int Tally::count(Outcome o) const {
  int n = 0;
  for (const Surface& s : surfaces_) n += s.counts[static_cast<int>(o)];
  return n;
}

int Tally::controls_accepted() const {
  return static_cast<int>(std::count_if(controls_.begin(), controls_.end(), [](const Control& c) { return c.accepted; }));
}

std::vector<std::string> Tally::Failures() const { return failures_; }

std::string Tally::Markdown() const {
  std::string md =
      "| Surface (how the input is fed) | Inputs | Refused | Accepted | Hang | Crash | Refused in one line | "
      "What the user sees (count) | Example |\n"
      "|---|---:|---:|---:|---:|---:|---:|---|---|\n";
  int total[4] = {0, 0, 0, 0}, one_line = 0;
  for (const Surface& s : surfaces_) {
    std::vector<std::pair<int, std::string>> codes;
    for (const auto& [code, n] : s.codes) codes.push_back({-n, code});
    std::sort(codes.begin(), codes.end());
    std::vector<std::string> shown;
    for (const auto& [n, code] : codes) shown.push_back(absl::StrCat(Clean(code, 40), " ", -n));
    const int n = s.counts[0] + s.counts[1] + s.counts[2] + s.counts[3];
    absl::StrAppend(&md, "| ", s.name, " | ", n, " | ", s.counts[0], " | ", s.counts[1], " | ", s.counts[2], " | ",
                    s.counts[3], " | ", s.one_line, "/", s.counts[0], " | ", absl::StrJoin(shown, ", "), " | `",
                    s.example, "` |\n");
    for (int i = 0; i < 4; ++i) total[i] += s.counts[i];
    one_line += s.one_line;
  }
  absl::StrAppend(&md, "| **Total** | **", total[0] + total[1] + total[2] + total[3], "** | **", total[0],
                  "** | **", total[1], "** | **", total[2], "** | **", total[3], "** | ", one_line, "/", total[0],
                  " | | |\n");
  absl::StrAppend(&md, "\nValid controls (must be accepted, so the driver can tell acceptance from refusal): ",
                  controls_accepted(), "/", controls_.size(), " accepted.\n\n| Surface | Valid input | Result |\n"
                  "|---|---|---|\n");
  for (const Control& c : controls_) {
    absl::StrAppend(&md, "| ", c.surface, " | ", Clean(c.input, 120), " | ",
                    c.accepted ? "accepted" : "NOT ACCEPTED: ", c.accepted ? "" : Clean(c.detail, 200), " |\n");
  }
  if (!notes_.empty()) {
    absl::StrAppend(&md, "\nRefusals worth a look (the message is not one line, or the code is UNAVAILABLE, which "
                         "clients retry until their deadline although the input will never succeed):\n\n");
    for (const Surface& s : surfaces_) {
      auto it = notes_.find(s.name);
      if (it == notes_.end()) continue;
      absl::StrAppend(&md, "- ", s.name, " (", it->second.size(), "):\n");
      for (size_t i = 0; i < it->second.size() && i < 4; ++i) absl::StrAppend(&md, "  - ", it->second[i], "\n");
      if (it->second.size() > 4) absl::StrAppend(&md, "  - and ", it->second.size() - 4, " more\n");
    }
  }
  if (!failures_.empty()) {
    absl::StrAppend(&md, "\nInputs not refused cleanly:\n\n| Surface | Input | Outcome | What happened |\n"
                         "|---|---|---|---|\n");
    for (const std::string& f : failures_) absl::StrAppend(&md, "| ", f, " |\n");
  }
  return md;
}

}  // namespace dynapipe::testing::hostile
