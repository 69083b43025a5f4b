// Dumps the micro-batches our planner gives a one-rank job, with the initial
// parameters, for benchmarks/cpu_bench and benchmarks/torch_gpt.py
// (format: benchmarks/batch_dump.h):
//   dump_batches --job configs/jobs/cpu-throughput.pbtxt --data_root . --method packing
//     --iterations 8 --out out/bench/packing
// The job runs as pp 1 x dp 1 whatever its file says.
#include <cstdio>
#include <filesystem>

#include "absl/flags/flag.h"
#include "benchmarks/plan_dump.h"
#include "src/common/proto_io.h"
#include "src/common/flags.h"

ABSL_FLAG(std::string, job, "configs/jobs/cpu-throughput.pbtxt", "JobSpec file");
ABSL_FLAG(std::string, data_root, ".", "relative dataset paths resolve here");
ABSL_FLAG(std::string, method, "", "batching method (dynamic, packing, padding); empty: the job's");
ABSL_FLAG(int, iterations, 8, "iterations to dump");
ABSL_FLAG(std::string, out, "", "output prefix: writes PREFIX.txt and PREFIX.bin");

int main(int argc, char** argv) {
  using namespace dynapipe;
  dynapipe::ParseFlags(argc, argv, "dump_batches", "dump_batches: writes the micro-batches our planner gives a one-rank job, with the initial parameters (benchmarks/README.md)");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "dump_batches: --out is required\n");
    return 2;
  }
  proto::JobSpec spec;
  if (auto s = LoadProtoFile(absl::GetFlag(FLAGS_job), &spec); !s.ok()) {
    std::fprintf(stderr, "dump_batches: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  spec.mutable_parallelism()->set_pp(1);
  spec.mutable_parallelism()->set_dp(1);
  if (const std::string m = absl::GetFlag(FLAGS_method); !m.empty()) {
    proto::BatchingSpec::Method method;
    if (!proto::BatchingSpec::Method_Parse(m, &method)) {
      std::fprintf(stderr, "dump_batches: --method: unknown method \"%s\"\n", m.c_str());
      return 2;
    }
    spec.mutable_batching()->set_method(method);
  }
  auto dump = benchmarks::DumpPlans(spec, absl::GetFlag(FLAGS_data_root), absl::GetFlag(FLAGS_iterations));
  if (!dump.ok()) {
    std::fprintf(stderr, "dump_batches: %s\n", dump.status().ToString().c_str());
    return 1;
  }
  if (const auto parent = std::filesystem::path(out).parent_path(); !parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
  }
  if (auto s = benchmarks::WriteBatchDump(*dump, out); !s.ok()) {
    std::fprintf(stderr, "dump_batches: %s\n", s.ToString().c_str());
    return 1;
  }
  int64_t micro_batches = 0, tokens = 0;
  for (const auto& it : dump->iterations) {
    micro_batches += static_cast<int64_t>(it.batches.size());
    tokens += it.real_tokens();
  }
  std::printf("dump_batches: %s: %zu iterations, %ld micro-batches, %ld real tokens -> %s.{txt,bin}\n",
              dump->method.c_str(), dump->iterations.size(), static_cast<long>(micro_batches),
              static_cast<long>(tokens), out.c_str());
  return 0;
}
