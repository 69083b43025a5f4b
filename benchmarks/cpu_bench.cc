// Our side of the comparison with PyTorch (benchmarks/README.md): trains
// the GPT stage on a dump's micro-batches (benchmarks/train_on_dump.h), then
// times each CPU kernel on the dump's shapes (benchmarks/op_timings.h).
// --backend cuda trains the CUDA stage instead (bf16, one GPU; no per-op
// timings, those are the CPU kernels'). Prints JSON lines, the same records
// as benchmarks/torch_gpt.py:
//   {"kind":"config", ...}
//   {"kind":"iteration","iteration":I,"loss":..,"grad_norm":..,"seconds":..,"real_tokens":..,"warmup":..}
//   {"kind":"end_to_end","tokens_per_s":..,"seconds":..,"real_tokens":..,"iterations":..}
//   {"kind":"op","op":NAME,"seconds":..,"calls":..}
// Build with --config=release; one BLAS thread (--threads).
#include <cblas.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "benchmarks/batch_dump.h"
#ifdef DYNAPIPE_KERNEL_TRACE
#include "benchmarks/kernel_trace.h"
#endif
#include "benchmarks/op_timings.h"
#include "benchmarks/train_on_dump.h"
#include "runtime/backend/backend.h"
#include "google/protobuf/struct.pb.h"
#include "src/common/proto_io.h"
#include "src/common/flags.h"

ABSL_FLAG(std::string, dump, "", "dump prefix (PREFIX.txt, PREFIX.bin) from dump_batches");
ABSL_FLAG(std::string, attention, "varlen", "attention kernel for training: varlen or materialized");
ABSL_FLAG(int, warmup, 1, "first iterations left out of tokens/s");
ABSL_FLAG(bool, train, true, "train end to end");
ABSL_FLAG(bool, ops, true, "time each op on the dump's shapes");
ABSL_FLAG(std::string, op_iterations, "1", "iterations whose micro-batches give the op shapes (comma-separated)");
ABSL_FLAG(int, op_reps, 5, "timed passes per op (median reported), after one warm-up pass");
ABSL_FLAG(int, threads, 1, "OpenBLAS threads");
ABSL_FLAG(std::string, backend, "cpu", "where to train: cpu (fp32) or cuda (bf16, --device)");
ABSL_FLAG(int, device, 0, "CUDA device index (--backend cuda)");
ABSL_FLAG(std::string, attention_kernel, dynapipe::runtime::BackendOptions{}.attention_kernel,
          "--backend cuda: auto, cudnn or tiled (as dynapipe-executor's flag)");
ABSL_FLAG(bool, matmul_epilogues, dynapipe::runtime::BackendOptions{}.matmul_epilogues,
          "--backend cuda: glue in cuBLASLt's epilogues (false: separate kernels)");
ABSL_FLAG(int, kernel_trace, -1,
          "--backend cuda: record every kernel of this iteration (CUPTI) and print one "
          "{\"kind\":\"kernel\",\"name\":..,\"ns\":..} line each (-1: none)");

namespace {

using dynapipe::benchmarks::BatchDump;

class Record {
 public:
  explicit Record(const char* kind) { Set("kind", kind); }
  Record& Set(const std::string& k, const std::string& v) {
    (*s_.mutable_fields())[k].set_string_value(v);
    return *this;
  }
  Record& Set(const std::string& k, const char* v) { return Set(k, std::string(v)); }
  Record& Set(const std::string& k, double v) {
    (*s_.mutable_fields())[k].set_number_value(v);
    return *this;
  }
  Record& Set(const std::string& k, bool v) {
    (*s_.mutable_fields())[k].set_bool_value(v);
    return *this;
  }
  void Print() const {
    std::printf("%s\n", dynapipe::ToJson(s_).c_str());
    std::fflush(stdout);
  }

 private:
  google::protobuf::Struct s_;
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cpu_bench: %s\n", s.ToString().c_str());
  return 1;
}

using dynapipe::benchmarks::TrainedIteration;

// A --flag that cannot work: the message on stderr, exit status 2.
int Usage(const std::string& message) {
  std::fprintf(stderr, "cpu_bench: %s\n", message.c_str());
  return 2;
}

dynapipe::runtime::BackendOptions BackendOptionsFromFlags(dynapipe::proto::Backend::Value kind) {
  dynapipe::runtime::BackendOptions o;
  o.kind = kind;
  o.device = absl::GetFlag(FLAGS_device);
  o.attention_kernel = absl::GetFlag(FLAGS_attention_kernel);
  o.matmul_epilogues = absl::GetFlag(FLAGS_matmul_epilogues);
  return o;
}

void PrintConfig(const dynapipe::runtime::Backend& backend, const BatchDump& dump, const std::string& kernel_name) {
  Record("config")
      .Set("impl", "ours")
      .Set("backend", backend.Describe())
      .Set("dump", absl::GetFlag(FLAGS_dump))
      .Set("method", dump.method)
      .Set("attention", kernel_name)
      .Set("threads", static_cast<double>(absl::GetFlag(FLAGS_threads)))
      .Print();
}

#ifdef DYNAPIPE_KERNEL_TRACE
// Records every kernel of iteration `trace_at` and prints a "kernel" record each.
dynapipe::benchmarks::AroundIteration KernelTraceAround(int trace_at) {
  auto trace = std::make_shared<std::unique_ptr<dynapipe::benchmarks::KernelTrace>>();
  return [trace, trace_at](size_t i, bool begin) -> absl::Status {
    if (static_cast<int>(i) != trace_at) return absl::OkStatus();
    if (begin) {
      auto t = dynapipe::benchmarks::KernelTrace::Start();
      if (!t.ok()) return t.status();
      *trace = std::move(*t);
      return absl::OkStatus();
    }
    auto kernels = (*trace)->Stop();
    if (!kernels.ok()) return kernels.status();
    for (const auto& k : *kernels) {
      Record("kernel").Set("iteration", static_cast<double>(i)).Set("name", k.name).Set("ns", static_cast<double>(k.ns)).Print();
    }
    return absl::OkStatus();
  };
}
#endif

// An "iteration" record each, then "end_to_end" over those after --warmup.
void PrintTraining(const std::vector<TrainedIteration>& trained) {
  const int warmup = absl::GetFlag(FLAGS_warmup);
  double seconds = 0, tokens = 0;
  int timed = 0;
  for (size_t i = 0; i < trained.size(); ++i) {
    const auto& r = trained[i];
    const bool warm = static_cast<int>(i) < warmup;
    Record("iteration")
        .Set("iteration", static_cast<double>(i))
        .Set("loss", r.loss)
        .Set("grad_norm", r.grad_norm)
        .Set("seconds", r.seconds)
        .Set("real_tokens", static_cast<double>(r.real_tokens))
        .Set("queue_seconds", r.queue_seconds)
        .Set("compute_seconds", r.compute_seconds)
        .Set("warmup", warm)
        .Print();
    if (warm) continue;
    seconds += r.seconds;
    tokens += static_cast<double>(r.real_tokens);
    ++timed;
  }
  if (timed > 0) {
    Record("end_to_end")
        .Set("tokens_per_s", tokens / seconds)
        .Set("seconds", seconds)
        .Set("real_tokens", tokens)
        .Set("iterations", static_cast<double>(timed))
        .Print();
  }
}

// --train: end to end on the dump (with --kernel-trace, one iteration's
// kernels); returns the exit status.
int Train(const BatchDump& dump, dynapipe::runtime::model::AttentionKernel kernel, dynapipe::runtime::Backend& backend,
          bool cuda) {
  const int trace_at = absl::GetFlag(FLAGS_kernel_trace);
  if (trace_at >= 0 && !cuda) return Usage("--kernel-trace needs --backend cuda");
  dynapipe::benchmarks::AroundIteration around;
#ifdef DYNAPIPE_KERNEL_TRACE
  if (trace_at >= 0) around = KernelTraceAround(trace_at);
#else
  if (trace_at >= 0) return Usage("--kernel-trace: this build has no CUDA");
#endif
  auto trained = dynapipe::benchmarks::TrainOnDump(dump, kernel, backend, around);
  if (!trained.ok()) return Fail(trained.status());
  PrintTraining(*trained);
  return 0;
}

// --ops: each CPU kernel timed on the shapes of --op_iterations; returns the exit status.
int TimeEachOp(const BatchDump& dump) {
  dynapipe::benchmarks::OpTimingOptions o;
  o.iterations.clear();
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_op_iterations), ',', absl::SkipEmpty())) {
    int i;
    if (!absl::SimpleAtoi(w, &i)) return Usage("--op_iterations: not a number: " + std::string(w));
    o.iterations.push_back(i);
  }
  o.reps = absl::GetFlag(FLAGS_op_reps);
  auto ops = dynapipe::benchmarks::TimeOps(dump, o);
  if (!ops.ok()) return Fail(ops.status());
  for (const auto& op : *ops) {
    Record("op").Set("op", op.op).Set("seconds", op.seconds).Set("calls", static_cast<double>(op.calls)).Print();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dynapipe;
  dynapipe::ParseFlags(argc, argv, "cpu_bench", "cpu_bench: trains the GPT stage on a dump and times each kernel on its shapes (benchmarks/README.md)");
  openblas_set_num_threads(absl::GetFlag(FLAGS_threads));
  const std::string kernel_name = absl::GetFlag(FLAGS_attention);
  if (kernel_name != "varlen" && kernel_name != "materialized") return Usage("--attention: varlen or materialized");
  const auto kernel = kernel_name == "varlen" ? runtime::model::AttentionKernel::kVarlen
                                              : runtime::model::AttentionKernel::kMaterialized;
  auto backend_kind = runtime::ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!backend_kind.ok()) return Usage(std::string(backend_kind.status().message()));
  const bool cuda = *backend_kind == proto::Backend::cuda;
  if (cuda && absl::GetFlag(FLAGS_ops)) {
    return Usage("--backend cuda: per-op timings are the CPU kernels'; pass --noops");
  }
  auto dump = benchmarks::ReadBatchDump(absl::GetFlag(FLAGS_dump));
  if (!dump.ok()) return Fail(dump.status());
  auto backend = runtime::CreateBackend(BackendOptionsFromFlags(*backend_kind));
  if (!backend.ok()) return Fail(backend.status());
  PrintConfig(**backend, *dump, kernel_name);
  if (absl::GetFlag(FLAGS_train)) {
    if (const int code = Train(*dump, kernel, **backend, cuda); code != 0) return code;
  }
  if (absl::GetFlag(FLAGS_ops)) return TimeEachOp(*dump);
  return 0;
}
