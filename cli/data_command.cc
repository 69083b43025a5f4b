#include "cli/data_command.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "src/data/dataset.h"
#include "src/data/synth.h"
#include "src/data/tokenizer.h"
#include "cli/args.h"
#include "src/data/lengths.h"
#include "src/common/proto_io.h"
#include "src/common/status_macros.h"

namespace dynapipe::cli {
namespace {

constexpr char kUsage[] =
    "usage: dynapipe data synth --out DIR --lengths FILE [--samples N] [--seed S] [--alphabet A] [--max-input L]\n"
    "                          [--input-scale F]   (input lengths x F, for small CPU runs; the mix keeps its shape)\n"
    "       dynapipe data import --in FILE.jsonl --out DIR [--vocab V]   (lines: {\"input\": [ids], \"target\": [ids], \"task\": \"name\"})\n"
    "       dynapipe data import --in FILE.jsonl --out DIR --tokenizer FILE.model   (lines: {\"input\": \"text\", \"target\": \"text\",\n"
    "                          \"task\": \"name\"}; SentencePiece ids, the target ending with its end-of-sequence id)\n"
    "       dynapipe data info DIR\n";

absl::Status Synth(const Args& a, std::ostream& out) {
  if (!a.Has("out") || !a.Has("lengths")) return absl::InvalidArgumentError("synth needs --out and --lengths");
  ASSIGN_OR_RETURN(auto lengths, data::ReadLengthsFile(a.Str("lengths")));
  ASSIGN_OR_RETURN(const int64_t n, a.Int("samples", static_cast<int64_t>(lengths.size())));
  if (n < 1) return absl::InvalidArgumentError("--samples: must be positive");
  data::SynthOptions o;
  ASSIGN_OR_RETURN(const int64_t seed, a.Int("seed", kSynthDefaultSeed));
  ASSIGN_OR_RETURN(const int64_t alphabet, a.Int("alphabet", kSynthDefaultAlphabet));
  ASSIGN_OR_RETURN(const int64_t max_input, a.Int("max-input", kSynthDefaultMaxInput));
  if (alphabet < 2 || alphabet > 1 << 20) return absl::InvalidArgumentError("--alphabet: must be in 2..1048576");
  if (max_input < 2) return absl::InvalidArgumentError("--max-input: must be at least 2");
  double scale = 1.0;
  if (a.Has("input-scale") && (!absl::SimpleAtod(a.Str("input-scale"), &scale) || !(scale > 0) || scale > 1)) {
    return absl::InvalidArgumentError("--input-scale: expected a number in (0, 1]");
  }
  o.seed = static_cast<uint64_t>(seed);
  o.alphabet = static_cast<int>(alphabet);
  o.max_input = static_cast<int>(max_input);
  // More samples than lines: the length list repeats.
  std::vector<data::RawLength> use;
  use.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    data::RawLength l = lengths[i % lengths.size()];
    l.input = std::max<int64_t>(2, std::llround(static_cast<double>(l.input) * scale));
    use.push_back(l);
  }
  proto::DatasetInfo info = data::SynthInfo(o);
  info.set_source(absl::StrCat(info.source(), ", lengths from ", a.Str("lengths")));
  ASSIGN_OR_RETURN(auto w, data::DatasetWriter::Create(a.Str("out"), info));
  RETURN_IF_ERROR(data::Synthesize(use, o, w.get()));
  RETURN_IF_ERROR(w->Finish());
  out << absl::StrFormat("wrote %d samples to %s\n", n, a.Str("out"));
  return absl::OkStatus();
}

// One sample on its way into a dataset.
struct Record {
  std::vector<uint32_t> input, target;
  std::string task;
};

// The records of a JSONL file: pre-tokenized ids, or text through
// `tokenizer` (its end-of-sequence id appended to each target). A line that
// is not a record is refused with its number; a progress line on `progress`
// every 10,000 lines.
absl::StatusOr<std::vector<Record>> ReadRecords(const std::string& path, data::Tokenizer* tokenizer,
                                                std::ostream& progress) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<Record> records;
  const absl::Time start = absl::Now();
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line_no % 10000 == 0) {
      progress << absl::StrFormat("import: %d lines, %.1f s\n", line_no, absl::ToDoubleSeconds(absl::Now() - start));
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    Record r;
    if (tokenizer == nullptr) {
      proto::JsonlRecord j;
      RETURN_IF_ERROR(ParseJsonProto(line, where, &j));
      r.input.assign(j.input().begin(), j.input().end());
      r.target.assign(j.target().begin(), j.target().end());
      r.task = j.task();
    } else {
      proto::JsonlTextRecord j;
      RETURN_IF_ERROR(ParseJsonProto(line, where, &j));
      ASSIGN_OR_RETURN(r.input, Annotate(tokenizer->Encode(j.input()), where));
      ASSIGN_OR_RETURN(r.target, Annotate(tokenizer->Encode(j.target()), where));
      if (tokenizer->eos_id() >= 0) r.target.push_back(static_cast<uint32_t>(tokenizer->eos_id()));
      r.task = j.task();
    }
    if (r.input.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty input"));
    if (r.task.empty()) r.task = "default";
    records.push_back(std::move(r));
  }
  if (records.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no records"));
  return records;
}

// "p50 A, p90 B, p99 C, max D" of `v` (sorted here).
std::string Percentiles(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  auto at = [&v](double q) { return v[static_cast<size_t>(q * (v.size() - 1))]; };
  return absl::StrFormat("p50 %d, p90 %d, p99 %d, max %d", at(0.5), at(0.9), at(0.99), v.back());
}

absl::Status Import(const Args& a, std::ostream& out, std::ostream& err) {
  if (!a.Has("in") || !a.Has("out")) return absl::InvalidArgumentError("import needs --in and --out");
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (a.Has("tokenizer")) {
    ASSIGN_OR_RETURN(tokenizer, data::Tokenizer::Load(a.Str("tokenizer"), data::Tokenizer::DefaultHelper()));
  }
  const absl::Time start = absl::Now();
  // Everything is read and checked before anything is written: a refused
  // line leaves no dataset behind.
  ASSIGN_OR_RETURN(const std::vector<Record> records, ReadRecords(a.Str("in"), tokenizer.get(), err));
  std::map<std::string, uint32_t> tasks;
  std::map<std::string, int64_t> per_task;
  uint32_t max_id = 0;
  std::vector<int64_t> in_len, tgt_len;
  int64_t in_tokens = 0, tgt_tokens = 0;
  for (const Record& r : records) {
    for (uint32_t id : r.input) max_id = std::max(max_id, id);
    for (uint32_t id : r.target) max_id = std::max(max_id, id);
    tasks.emplace(r.task, 0);
    ++per_task[r.task];
    in_len.push_back(static_cast<int64_t>(r.input.size()));
    tgt_len.push_back(static_cast<int64_t>(r.target.size()));
    in_tokens += in_len.back();
    tgt_tokens += tgt_len.back();
  }
  const int64_t fallback = tokenizer != nullptr ? tokenizer->vocab_size() : static_cast<int64_t>(max_id) + 1;
  ASSIGN_OR_RETURN(const int64_t vocab, a.Int("vocab", fallback));
  if (vocab <= max_id) return absl::InvalidArgumentError(absl::StrCat("--vocab: ", vocab, " but token ", max_id, " appears"));
  proto::DatasetInfo info;
  info.set_vocab(static_cast<uint32_t>(vocab));
  uint32_t next = 0;
  for (auto& [name, id] : tasks) {
    id = next++;
    info.add_tasks(name);
  }
  info.set_source(absl::StrCat("import ", a.Str("in"), tokenizer ? absl::StrCat(", tokenizer ", a.Str("tokenizer")) : ""));
  ASSIGN_OR_RETURN(auto w, data::DatasetWriter::Create(a.Str("out"), info));
  for (const Record& r : records) RETURN_IF_ERROR(w->Add(r.input, r.target, tasks[r.task]));
  RETURN_IF_ERROR(w->Finish());
  out << absl::StrFormat("imported %d samples (%d tasks, vocab %d) to %s in %.1f s\n", records.size(), tasks.size(),
                         vocab, a.Str("out"), absl::ToDoubleSeconds(absl::Now() - start));
  out << absl::StrFormat("  input tokens %d (%s)\n  target tokens %d (%s)\n", in_tokens, Percentiles(in_len),
                         tgt_tokens, Percentiles(tgt_len));
  for (const auto& [name, n] : per_task) out << absl::StrFormat("  task %-16s %d samples\n", name, n);
  return absl::OkStatus();
}

absl::Status Info(const std::string& dir, std::ostream& out) {
  ASSIGN_OR_RETURN(auto d, data::Dataset::Open(dir));
  RETURN_IF_ERROR(Annotate(d->VerifyTokens(), dir));
  std::vector<int64_t> per_task(d->info().tasks_size(), 0);
  int64_t in_tokens = 0, tgt_tokens = 0, max_in = 0;
  for (uint64_t i = 0; i < d->size(); ++i) {
    const auto s = d->sample(i);
    ++per_task[s.task];
    in_tokens += s.input.size();
    tgt_tokens += s.target.size();
    max_in = std::max<int64_t>(max_in, s.input.size());
  }
  out << absl::StrFormat("%s: %d samples, vocab %d, input tokens %d (mean %.1f, max %d), target tokens %d\n", dir,
                         d->size(), d->info().vocab(), in_tokens, d->size() ? double(in_tokens) / d->size() : 0.0,
                         max_in, tgt_tokens);
  for (int t = 0; t < d->info().tasks_size(); ++t) out << absl::StrFormat("  task %-16s %d samples\n", d->info().tasks(t), per_task[t]);
  out << "  source: " << d->info().source() << "\n";
  return absl::OkStatus();
}

}  // namespace

int RunDataCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.empty() || argv[0] == "--help") {
    (argv.empty() ? err : out) << kUsage;
    return argv.empty() ? 2 : 0;
  }
  const std::string sub = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  auto fail = [&](const absl::Status& s) {
    err << "dynapipe data " << sub << ": " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  if (sub == "info") {
    if (rest.size() != 1) return fail(absl::InvalidArgumentError("usage: dynapipe data info DIR"));
    const absl::Status s = Info(rest[0], out);
    return s.ok() ? 0 : fail(s);
  }
  auto args = Args::Parse(rest, {"out", "lengths", "samples", "seed", "alphabet", "max-input", "input-scale", "in", "vocab", "tokenizer"}, {});
  if (!args.ok()) return fail(args.status());
  absl::Status s;
  if (sub == "synth") {
    s = Synth(*args, out);
  } else if (sub == "import") {
    s = Import(*args, out, err);
  } else {
    err << kUsage;
    return 2;
  }
  return s.ok() ? 0 : fail(s);
}

}  // namespace dynapipe::cli
