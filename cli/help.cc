#include "cli/help.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/data_command.h"
#include "cli/job_commands.h"
#include "src/rpc/defaults.h"

namespace dynapipe::cli {
namespace {

// Flags of every verb that talks to the planner.
std::vector<std::pair<std::string, std::string>> ClientFlags(std::vector<std::pair<std::string, std::string>> own) {
  own.insert(own.end(), {
                            {"--planner HOST:PORT[,HOST:PORT]", absl::StrCat("planner address(es) (env DYNAPIPE_PLANNER; default ", std::string(rpc::kDefaultPlannerAddress), ")")},
                            {"--token-file FILE", "file holding the API token (env DYNAPIPE_TOKEN_FILE)"},
                            {"--tls-ca FILE", "PEM CA certificate of the planner (enables TLS)"},
                            {"--timeout-s N", absl::StrCat("deadline of each call to the planner (default ", kDefaultCallTimeoutS, ")")},
                        });
  return own;
}

std::vector<VerbHelp> MakeVerbs() {
  const std::pair<std::string, std::string> json = {"--json", "print JSON instead of a table"};
  return {
      {"plan", "plan global batches offline and report", "", {},
       "dynapipe plan --lengths tests/data/flan-like-lengths.txt --model gpt-6.7b --stages 8 --max-seqlen 4096 --compare"},
      {"submit", "submit a job to the planner; prints its id", "dynapipe submit JOB.pbtxt|JOB.json [flags]",
       ClientFlags({}), "dynapipe submit configs/jobs/quickstart.pbtxt"},
      {"status", "one job's state, or every active job's (--all: ended ones too)", "dynapipe status [JOB] [flags]",
       ClientFlags({json, {"--all", "list jobs that ended too"}}),
       "dynapipe status job-e332d71f-000001 --json"},
      {"list", "every active job, a line each (--all: ended ones too)", "dynapipe list [flags]",
       ClientFlags({json, {"--all", "list jobs that ended too"}}), "dynapipe list --all"},
      {"cancel", "cancel a job", "dynapipe cancel JOB [flags]",
       ClientFlags({}), "dynapipe cancel job-e332d71f-000001"},
      {"watch",
       "a line per iteration until the job ends, riding through planner restarts; exit 0 only for a job that "
       "succeeded",
       "dynapipe watch JOB [flags]",
       ClientFlags({json,
                    {"--grace-s N", absl::StrCat("give up when the planner stays unreachable this long (default ",
                                                 rpc::kDefaultPlannerGraceS, ", as executors)")}}),
       "dynapipe watch job-e332d71f-000001"},
      {"history", "a job's completed iterations, a line each (kept after the job ends)",
       "dynapipe history JOB [flags]",
       ClientFlags({{"--from N", "the first iteration shown (default 0)"},
                    {"--limit N", "at most N iterations (default 1000)"},
                    json}),
       "dynapipe history job-e332d71f-000001 --from 100 --limit 20"},
      {"trace", "a Perfetto/Chrome trace of one iteration: measured and planned timelines of every rank",
       "dynapipe trace JOB --iteration N [flags]",
       ClientFlags({{"--iteration N", "the iteration (0-based; one of the last hour: plans and reports expire)"},
                    {"--out FILE", "where to write it (default JOB-iteration-N.trace.json)"}}),
       "dynapipe trace job-e332d71f-000001 --iteration 41 --out it41.json"},
      {"executors", "registered executors and their assignments", "dynapipe executors [flags]", ClientFlags({json}),
       "dynapipe executors --planner 10.0.0.5:50051 --token-file /etc/dynapipe/token"},
      {"data", "make and inspect training datasets: synth | import | info", "dynapipe data synth|import|info ...",
       {}, "dynapipe data info data/quickstart"},
      {"data synth", "a learnable multi-task dataset whose lengths follow a lengths file",
       "dynapipe data synth --out DIR --lengths FILE [flags]",
       {{"--out DIR", "the dataset directory to write"},
        {"--lengths FILE", "lengths file: one \"input target\" pair per line"},
        {"--samples N", "samples to write (default: one per line of the lengths file)"},
        {"--seed S", absl::StrCat("random seed (default ", kSynthDefaultSeed, ")")},
        {"--alphabet A", absl::StrCat("token alphabet of the tasks (default ", kSynthDefaultAlphabet, ")")},
        {"--max-input L", absl::StrCat("longest input kept (default ", kSynthDefaultMaxInput, ")")},
        {"--input-scale F", "input lengths x F in (0, 1], for small CPU runs (default 1)"}},
       "dynapipe data synth --out data/throughput --lengths tests/data/flan-like-lengths.txt --samples 20000 "
       "--input-scale 0.25"},
      {"data import", "a dataset from JSON lines: token ids, or text through a SentencePiece tokenizer", "dynapipe data import --in FILE.jsonl --out DIR [flags]",
       {{"--in FILE.jsonl", "one {\"input\": [ids], \"target\": [ids], \"task\": \"name\"} object per line"},
        {"--out DIR", "the dataset directory to write"},
        {"--vocab V", "vocabulary size (default: the largest id + 1, or the tokenizer's)"},
        {"--tokenizer FILE.model", "a SentencePiece model: lines hold text ({\"input\": \"...\", \"target\": \"...\", "
                                   "\"task\": \"name\"}), tokenized on import"}},
       "dynapipe data import --in flan.jsonl --out data/flan"},
      {"data info", "samples, tokens and tasks of a dataset", "dynapipe data info DIR", {},
       "dynapipe data info data/quickstart"},
      {"eval", "per-task held-out accuracy of a job's checkpoint", "", {},
       "dynapipe eval --job configs/jobs/quickstart.pbtxt --data data/quickstart-eval"},
      {"export", "a job's trained model in Hugging Face's format (safetensors + config.json)", "", {},
       "dynapipe export configs/jobs/quickstart.pbtxt --out out/quickstart-hf"},
      {"profile", "measure the job's model on this CPU into a cost profile", "", {},
       "dynapipe profile --job configs/jobs/cpu-throughput.pbtxt --out data/throughput/cpu-profile.json"},
  };
}

}  // namespace

const std::vector<VerbHelp>& Verbs() {
  static const std::vector<VerbHelp> verbs = MakeVerbs();
  return verbs;
}

const VerbHelp* FindVerb(std::string_view verb) {
  for (const VerbHelp& v : Verbs()) {
    if (v.verb == verb) return &v;
  }
  return nullptr;
}

bool AsksForHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") return false;
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

std::string TopUsage() {
  std::string s = "usage: dynapipe <command> [flags]   (dynapipe <command> --help for its flags and an example)\ncommands:\n";
  for (const VerbHelp& v : Verbs()) {
    if (v.verb.find(' ') != std::string::npos) continue;  // sub-verbs are listed by their verb
    absl::StrAppend(&s, absl::StrFormat("  %-10s %s\n", v.verb, v.summary));
  }
  absl::StrAppend(&s,
                  "  --version  the version, commit and build type\n"
                  "common flags of the commands that talk to the planner: --planner HOST:PORT ($DYNAPIPE_PLANNER),\n"
                  "  --token-file FILE ($DYNAPIPE_TOKEN_FILE), --tls-ca FILE, --timeout-s N\n");
  return s;
}

std::string VerbUsage(const VerbHelp& v) {
  std::string s = absl::StrCat("usage: ", v.usage, "\n", v.summary, "\n");
  if (v.verb == "data") {
    for (const VerbHelp& sub : Verbs()) {
      if (sub.verb.rfind("data ", 0) == 0) absl::StrAppend(&s, absl::StrFormat("  %-12s %s\n", sub.verb, sub.summary));
    }
  }
  if (!v.flags.empty()) {
    size_t width = 0;
    for (const auto& f : v.flags) width = std::max(width, f.first.size());
    absl::StrAppend(&s, "flags:\n");
    for (const auto& [flag, text] : v.flags) absl::StrAppend(&s, "  ", flag, std::string(width + 2 - flag.size(), ' '), text, "\n");
  }
  absl::StrAppend(&s, "example:\n  ", v.example, "\n");
  return s;
}

}  // namespace dynapipe::cli
