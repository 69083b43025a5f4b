#pragma once

// Outcomes of feeding malformed inputs to the daemons and the CLI, counted
// per input surface, and the Markdown table they make
// (docs/hostile-inputs.md is that table, written by deploy/hostile_inputs.sh).

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dynapipe::testing::hostile {

enum class Outcome {
  kRefused,   // non-zero exit / non-OK status / 4xx / connection closed, the daemon still healthy
  kAccepted,  // garbage taken as valid
  kHang,      // no answer within the deadline
  kCrash,     // killed by a signal, or the daemon died or stopped answering /healthz
};

const char* OutcomeName(Outcome o);

struct Result {
  Outcome outcome = Outcome::kRefused;
  std::string code;     // what the user got: "INVALID_ARGUMENT", "exit 2", "HTTP 400", "closed"
  std::string message;  // the text the user sees (stderr, status message, response status line)
};

class Tally {
 public:
  // `redactions`: substrings replaced in the table (scratch paths -> "$ROOT").
  explicit Tally(std::vector<std::pair<std::string, std::string>> redactions = {});

  // One input of the corpus fed to `surface`.
  void Add(const std::string& surface, const std::string& input, const Result& result);
  // A valid input that must be accepted (it shows the classifier can say "accepted").
  void AddControl(const std::string& surface, const std::string& input, bool accepted, const std::string& detail);

  // Every input is printed as it is added (else only those not refused).
  void set_verbose(bool verbose) { verbose_ = verbose; }
  // A message showing `secret` (the API token) is a leak: listed with the failures.
  void set_secret(std::string secret) { secret_ = std::move(secret); }
  int leaks() const { return leaks_; }

  int inputs() const;
  int count(Outcome o) const;
  int controls() const { return static_cast<int>(controls_.size()); }
  int controls_accepted() const;
  // "surface | input | outcome | message" for every input that was not refused
  // and every control that was not accepted.
  std::vector<std::string> Failures() const;
  // The tables (per surface; controls; failures if any), Markdown.
  std::string Markdown() const;

 private:
  struct Surface {
    std::string name;
    int counts[4] = {0, 0, 0, 0};
    std::map<std::string, int> codes;  // what the user got, by kind
    int one_line = 0;                  // refusals that said why in exactly one non-empty line
    std::string example;               // the first refusal's message
  };
  struct Control {
    std::string surface, input, detail;
    bool accepted;
  };
  std::string Clean(std::string text, size_t limit) const;
  Surface& Find(const std::string& name);

  std::vector<std::pair<std::string, std::string>> redactions_;
  std::vector<Surface> surfaces_;  // in the order first seen
  std::vector<std::string> failures_;
  // Refusals worth a look: not in one line, or a code clients retry
  // (UNAVAILABLE) for an input that will never succeed. By surface.
  std::map<std::string, std::vector<std::string>> notes_;
  std::vector<Control> controls_;
  bool verbose_ = false;
  std::string secret_;
  int leaks_ = 0;
};

}  // namespace dynapipe::testing::hostile
