#include "benchmarks/batch_dump.h"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/status_macros.h"

namespace dynapipe::benchmarks {

namespace {

using runtime::model::Recompute;
using runtime::model::TokenBatch;

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
    case Recompute::kNone: break;
  }
  return "none";
}

std::string Steps(const std::vector<DumpStep>& steps) {
  return absl::StrJoin(steps, ",", [](std::string* out, const DumpStep& s) {
    absl::StrAppend(out, s.forward ? "f" : "b", s.micro_batch);
  });
}

// One manifest line's `key=value` fields.
class Fields {
 public:
  Fields(const std::vector<absl::string_view>& words, int line) : line_(line) {
    for (absl::string_view w : words) {
      const size_t eq = w.find('=');
      if (eq != absl::string_view::npos) kv_[std::string(w.substr(0, eq))] = std::string(w.substr(eq + 1));
    }
  }
  absl::StatusOr<std::string> Str(const std::string& key) const {
    auto it = kv_.find(key);
    if (it == kv_.end()) return absl::InvalidArgumentError(absl::StrCat("manifest line ", line_, ": no ", key, "="));
    return it->second;
  }
  absl::StatusOr<int64_t> Int(const std::string& key) const {
    ASSIGN_OR_RETURN(const std::string s, Str(key));
    int64_t v;
    if (!absl::SimpleAtoi(s, &v)) return Bad(key);
    return v;
  }
  absl::StatusOr<double> Double(const std::string& key) const {
    ASSIGN_OR_RETURN(const std::string s, Str(key));
    double v;
    if (!absl::SimpleAtod(s, &v)) return Bad(key);
    return v;
  }

 private:
  absl::Status Bad(const std::string& key) const {
    return absl::InvalidArgumentError(absl::StrCat("manifest line ", line_, ": ", key, "= is not a number"));
  }
  int line_;
  std::map<std::string, std::string> kv_;
};

absl::StatusOr<Recompute> ParseRecompute(const std::string& s, int line) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(absl::StrCat("manifest line ", line, ": recompute=", s));
}

absl::StatusOr<std::vector<DumpStep>> ParseSteps(const std::string& s, int line) {
  std::vector<DumpStep> out;
  for (absl::string_view w : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    DumpStep step;
    int mb;
    if (w.size() < 2 || (w[0] != 'f' && w[0] != 'b') || !absl::SimpleAtoi(w.substr(1), &mb) || mb < 0) {
      return absl::InvalidArgumentError(absl::StrCat("manifest line ", line, ": bad step ", w));
    }
    step.forward = w[0] == 'f';
    step.micro_batch = mb;
    out.push_back(step);
  }
  return out;
}

// One manifest record: its words and fields, and where it is for errors.
struct Record {
  const std::vector<absl::string_view>& w;
  const Fields& f;
  const std::string& prefix;
  int n;  // its line
  absl::Status Bad(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".txt:", n, ": ", why));
  }
};

// The tensors' bytes, taken in manifest order.
struct TensorData {
  std::string bin;
  size_t at = 0;
};

absl::Status ParseModel(const Record& rec, BatchDump& d) {
  const Fields& f = rec.f;
  auto& c = d.config;
  ASSIGN_OR_RETURN(c.num_layers, f.Int("layers"));
  ASSIGN_OR_RETURN(c.hidden, f.Int("hidden"));
  ASSIGN_OR_RETURN(c.heads, f.Int("heads"));
  ASSIGN_OR_RETURN(c.ffn, f.Int("ffn"));
  ASSIGN_OR_RETURN(c.vocab, f.Int("vocab"));
  ASSIGN_OR_RETURN(c.max_positions, f.Int("max_positions"));
  ASSIGN_OR_RETURN(const int64_t tied, f.Int("tie_embeddings"));
  c.tie_embeddings = tied != 0;
  ASSIGN_OR_RETURN(const int64_t seed, f.Int("seed"));
  d.seed = static_cast<uint64_t>(seed);
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const Record& rec, BatchDump& d) {
  const Fields& f = rec.f;
  ASSIGN_OR_RETURN(d.adamw.lr, f.Double("lr"));
  ASSIGN_OR_RETURN(d.adamw.beta1, f.Double("beta1"));
  ASSIGN_OR_RETURN(d.adamw.beta2, f.Double("beta2"));
  ASSIGN_OR_RETURN(d.adamw.eps, f.Double("eps"));
  ASSIGN_OR_RETURN(d.adamw.weight_decay, f.Double("weight_decay"));
  ASSIGN_OR_RETURN(d.grad_clip, f.Double("grad_clip"));
  return absl::OkStatus();
}

absl::Status ParseJob(const Record& rec, BatchDump& d) {
  ASSIGN_OR_RETURN(d.job_name, rec.f.Str("name"));
  ASSIGN_OR_RETURN(d.method, rec.f.Str("method"));
  return absl::OkStatus();
}

absl::Status ParseIteration(const Record& rec, BatchDump& d) {
  int64_t i;
  if (rec.w.size() < 2 || !absl::SimpleAtoi(rec.w[1], &i) || i != static_cast<int64_t>(d.iterations.size())) {
    return rec.Bad("iterations out of order");
  }
  IterationDump it;
  ASSIGN_OR_RETURN(const double scale, rec.f.Double("loss_scale"));
  it.loss_scale = static_cast<float>(scale);
  ASSIGN_OR_RETURN(it.lr, rec.f.Double("lr"));
  ASSIGN_OR_RETURN(it.predicted_ms, rec.f.Double("predicted_ms"));
  ASSIGN_OR_RETURN(const std::string steps, rec.f.Str("steps"));
  ASSIGN_OR_RETURN(it.steps, ParseSteps(steps, rec.n));
  d.iterations.push_back(std::move(it));
  return absl::OkStatus();
}

absl::Status ParseMicroBatch(const Record& rec, BatchDump& d) {
  int64_t i, j;
  if (rec.w.size() < 3 || !absl::SimpleAtoi(rec.w[1], &i) || !absl::SimpleAtoi(rec.w[2], &j) || d.iterations.empty() ||
      i + 1 != static_cast<int64_t>(d.iterations.size()) ||
      j != static_cast<int64_t>(d.iterations.back().batches.size())) {
    return rec.Bad("micro-batches out of order");
  }
  TokenBatch mb;
  ASSIGN_OR_RETURN(mb.rows, rec.f.Int("rows"));
  ASSIGN_OR_RETURN(mb.seq, rec.f.Int("seq"));
  ASSIGN_OR_RETURN(mb.real_tokens, rec.f.Int("real_tokens"));
  ASSIGN_OR_RETURN(mb.loss_tokens, rec.f.Int("loss_tokens"));
  ASSIGN_OR_RETURN(const std::string r, rec.f.Str("recompute"));
  ASSIGN_OR_RETURN(const Recompute rec_level, ParseRecompute(r, rec.n));
  d.iterations.back().batches.push_back(std::move(mb));
  d.iterations.back().recompute.push_back(rec_level);
  return absl::OkStatus();
}

// A micro-batch tensor (it<I>.mb<J>.FIELD) into the last micro-batch read.
absl::Status SetBatchTensor(const Record& rec, const std::string& name, int64_t count, const char* src, BatchDump& d) {
  if (d.iterations.empty() || d.iterations.back().batches.empty()) return rec.Bad("tensor outside a micro-batch");
  TokenBatch& mb = d.iterations.back().batches.back();
  if (count != mb.rows * mb.seq) return rec.Bad("tensor shape differs from its micro-batch");
  std::vector<int32_t> v(static_cast<size_t>(count));
  std::memcpy(v.data(), src, static_cast<size_t>(count) * 4);
  const std::string field = name.substr(name.rfind('.') + 1);
  if (field == "tokens") {
    mb.tokens = std::move(v);
  } else if (field == "positions") {
    mb.positions = std::move(v);
  } else if (field == "segments") {
    mb.segments = std::move(v);
  } else if (field == "targets") {
    mb.targets = std::move(v);
  } else {
    return rec.Bad("unknown tensor " + name);
  }
  return absl::OkStatus();
}

// `tensor NAME i32|f32 DIMS...`: takes its bytes from `data`; a parameter or
// a field of the last micro-batch.
absl::Status ParseTensor(const Record& rec, TensorData& data, BatchDump& d) {
  const auto& w = rec.w;
  if (w.size() < 4 || (w[2] != "i32" && w[2] != "f32")) return rec.Bad("expected `tensor NAME i32|f32 DIMS...`");
  int64_t count = 1;
  std::vector<int64_t> shape;
  for (size_t k = 3; k < w.size(); ++k) {
    int64_t dim;
    if (!absl::SimpleAtoi(w[k], &dim) || dim < 0 || dim > (int64_t{1} << 32)) return rec.Bad("bad dimension");
    count *= dim;
    shape.push_back(dim);
  }
  if (count > (int64_t{1} << 34)) return rec.Bad("tensor too large");
  const size_t bytes = static_cast<size_t>(count) * 4;
  if (data.at + bytes > data.bin.size()) {
    return absl::DataLossError(absl::StrCat(rec.prefix, ".bin ends before ", w[1]));
  }
  const char* src = data.bin.data() + data.at;
  data.at += bytes;
  const std::string name(w[1]);
  if (!name.starts_with("param.")) return SetBatchTensor(rec, name, count, src, d);
  DumpParam p{name.substr(6), std::move(shape), std::vector<float>(static_cast<size_t>(count))};
  std::memcpy(p.values.data(), src, bytes);
  d.params.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status ParseRecord(const Record& rec, TensorData& data, BatchDump& d) {
  const absl::string_view kind = rec.w[0];
  if (kind == "model") return ParseModel(rec, d);
  if (kind == "optimizer") return ParseOptimizer(rec, d);
  if (kind == "job") return ParseJob(rec, d);
  if (kind == "iteration") return ParseIteration(rec, d);
  if (kind == "micro_batch") return ParseMicroBatch(rec, d);
  if (kind == "tensor") return ParseTensor(rec, data, d);
  return rec.Bad(absl::StrCat("unknown record ", kind));
}

// Every micro-batch well-formed for the model, every step naming one.
absl::Status CheckDump(const BatchDump& d, const std::string& prefix) {
  for (const IterationDump& it : d.iterations) {
    for (const TokenBatch& mb : it.batches) {
      RETURN_IF_ERROR(runtime::model::CheckTokenBatch(mb, d.config));
    }
    for (const DumpStep& s : it.steps) {
      if (s.micro_batch >= static_cast<int>(it.batches.size())) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, ".txt: a step names micro-batch ", s.micro_batch));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t IterationDump::real_tokens() const {
  int64_t n = 0;
  for (const TokenBatch& b : batches) n += b.real_tokens;
  return n;
}

double ModelFlops(const runtime::model::GptConfig& config, const TokenBatch& batch) {
  const double h = config.hidden, f = config.ffn, layers = config.num_layers;
  double pairs = 0;
  for (int64_t r = 0; r < batch.rows; ++r) {
    const int32_t* seg = batch.segments.data() + r * batch.seq;
    for (int64_t t = 0; t < batch.seq;) {
      int64_t end = t + 1;
      while (end < batch.seq && seg[end] == seg[t]) ++end;
      if (seg[t] >= 0) {
        const double n = static_cast<double>(end - t);
        pairs += n * (n + 1) / 2;
      }
      t = end;
    }
  }
  const double layer_weights = 4 * h * h + 2 * h * f;  // qkv, proj, fc, mproj
  const double forward = 2 * layers * layer_weights * static_cast<double>(batch.real_tokens) +
                         2 * h * config.vocab * static_cast<double>(batch.loss_tokens) + 4 * h * layers * pairs;
  return 3 * forward;
}

absl::Status WriteBatchDump(const BatchDump& d, const std::string& prefix) {
  std::ostringstream txt;
  std::string bin;
  const auto& c = d.config;
  txt << "# Micro-batches and initial parameters (benchmarks/batch_dump.h describes the format).\n";
  txt << absl::StrFormat(
      "model layers=%d hidden=%d heads=%d ffn=%d vocab=%d max_positions=%d tie_embeddings=%d seed=%d\n",
      c.num_layers, c.hidden, c.heads, c.ffn, c.vocab, c.max_positions, c.tie_embeddings ? 1 : 0, d.seed);
  txt << absl::StrFormat("optimizer lr=%.17g beta1=%.17g beta2=%.17g eps=%.17g weight_decay=%.17g grad_clip=%.17g\n",
                         d.adamw.lr, d.adamw.beta1, d.adamw.beta2, d.adamw.eps, d.adamw.weight_decay, d.grad_clip);
  txt << "job name=" << d.job_name << " method=" << d.method << "\n";
  auto tensor = [&](const std::string& name, const char* dtype, std::vector<int64_t> dims, const void* data,
                    size_t bytes) {
    txt << "tensor " << name << " " << dtype << " " << absl::StrJoin(dims, " ") << "\n";
    bin.append(static_cast<const char*>(data), bytes);
  };
  for (size_t i = 0; i < d.iterations.size(); ++i) {
    const IterationDump& it = d.iterations[i];
    double flops = 0;
    for (const TokenBatch& b : it.batches) flops += ModelFlops(d.config, b);
    txt << absl::StrFormat("iteration %d loss_scale=%.9g lr=%.17g predicted_ms=%.6g model_flops=%.6g micro_batches=%d steps=%s\n",
                           i, it.loss_scale, it.lr, it.predicted_ms, flops, it.batches.size(), Steps(it.steps));
    for (size_t j = 0; j < it.batches.size(); ++j) {
      const TokenBatch& b = it.batches[j];
      txt << absl::StrFormat("micro_batch %d %d rows=%d seq=%d real_tokens=%d loss_tokens=%d recompute=%s\n", i, j,
                             b.rows, b.seq, b.real_tokens, b.loss_tokens, RecomputeName(it.recompute[j]));
      const std::string base = absl::StrCat("it", i, ".mb", j, ".");
      const size_t bytes = b.tokens.size() * sizeof(int32_t);
      tensor(base + "tokens", "i32", {b.rows, b.seq}, b.tokens.data(), bytes);
      tensor(base + "positions", "i32", {b.rows, b.seq}, b.positions.data(), bytes);
      tensor(base + "segments", "i32", {b.rows, b.seq}, b.segments.data(), bytes);
      tensor(base + "targets", "i32", {b.rows, b.seq}, b.targets.data(), bytes);
    }
  }
  for (const DumpParam& p : d.params) {
    tensor("param." + p.name, "f32", p.shape, p.values.data(), p.values.size() * sizeof(float));
  }
  std::ofstream t(prefix + ".txt", std::ios::trunc), b(prefix + ".bin", std::ios::binary | std::ios::trunc);
  t << txt.str();
  b.write(bin.data(), static_cast<std::streamsize>(bin.size()));
  t.close();
  b.close();
  if (!t || !b) return absl::UnavailableError(absl::StrCat("cannot write ", prefix, ".{txt,bin}"));
  return absl::OkStatus();
}

absl::StatusOr<BatchDump> ReadBatchDump(const std::string& prefix) {
  std::ifstream t(prefix + ".txt");
  std::ifstream b(prefix + ".bin", std::ios::binary);
  if (!t || !b) return absl::NotFoundError(absl::StrCat("cannot open ", prefix, ".{txt,bin}"));
  TensorData data{std::string((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>())};
  BatchDump d;
  std::string line;
  int n = 0;
  while (std::getline(t, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    const Fields f(w, n);
    RETURN_IF_ERROR(ParseRecord(Record{w, f, prefix, n}, data, d));
  }
  if (data.at != data.bin.size()) {
    return absl::DataLossError(absl::StrCat(prefix, ".bin holds more than its manifest names"));
  }
  RETURN_IF_ERROR(CheckDump(d, prefix));
  return d;
}

}  // namespace dynapipe::benchmarks
