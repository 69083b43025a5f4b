// Trains one job with several batching methods on the CPU backend, ranks as
// threads of this process (the same worker code the daemons run), and
// prints real tokens/s, measured vs predicted iteration time and losses for
// each, side by side in one run:
//   cpu_throughput --job configs/jobs/quickstart.pbtxt --data_root . --iterations 20
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "runtime/executor/local_run.h"
#include "src/common/proto_io.h"

ABSL_FLAG(std::string, job, "configs/jobs/quickstart.pbtxt", "JobSpec file");
ABSL_FLAG(std::string, data_root, ".", "relative dataset paths resolve here");
ABSL_FLAG(int, iterations, 20, "iterations per method");
ABSL_FLAG(std::string, methods, "dynamic,packing,padding", "batching methods to compare");
ABSL_FLAG(int, pp, 0, "override parallelism.pp");
ABSL_FLAG(int, dp, 0, "override parallelism.dp");
ABSL_FLAG(double, lr, 0, "override optimizer.lr");
ABSL_FLAG(int, curve, 0, "also print the loss every N iterations");
ABSL_FLAG(std::string, cost_profile, "",
          "override cost_profile_path: a `dynapipe profile` output, relative paths under --data_root");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace dynapipe;
  proto::JobSpec spec;
  if (auto s = LoadProtoFile(absl::GetFlag(FLAGS_job), &spec); !s.ok()) {
    std::fprintf(stderr, "cpu_throughput: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_pp) > 0) spec.mutable_parallelism()->set_pp(absl::GetFlag(FLAGS_pp));
  if (absl::GetFlag(FLAGS_dp) > 0) spec.mutable_parallelism()->set_dp(absl::GetFlag(FLAGS_dp));
  if (absl::GetFlag(FLAGS_lr) > 0) spec.mutable_optimizer()->set_lr(absl::GetFlag(FLAGS_lr));
  if (!absl::GetFlag(FLAGS_cost_profile).empty()) spec.set_cost_profile_path(absl::GetFlag(FLAGS_cost_profile));
  const int n = absl::GetFlag(FLAGS_iterations);
  spec.set_iterations(std::max<int64_t>(spec.iterations(), n));
  std::printf("%-8s %12s %14s %14s %8s %8s %10s %10s\n", "method", "tokens/s", "measured ms", "predicted ms",
              "mb/iter", "padding", "loss[0]", "loss[-1]");
  for (const std::string& m : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_methods), ','))) {
    proto::BatchingSpec::Method method;
    if (!proto::BatchingSpec::Method_Parse(m, &method)) {
      std::fprintf(stderr, "cpu_throughput: --methods: unknown method \"%s\"\n", m.c_str());
      return 2;
    }
    spec.mutable_batching()->set_method(method);
    auto run = runtime::executor::RunLocal(spec, absl::GetFlag(FLAGS_data_root), n);
    if (!run.ok()) {
      std::fprintf(stderr, "cpu_throughput: %s: %s\n", m.c_str(), std::string(run.status().message()).c_str());
      return 1;
    }
    // Tokens of the whole iteration: the first pipeline stage of every group.
    const int pp = std::max(1, spec.parallelism().pp());
    int64_t tokens = 0;
    double measured = 0, predicted = 0, micro_batches = 0, efficiency = 0;
    for (size_t r = 0; r < run->per_rank.size(); r += pp) {
      for (const auto& it : run->per_rank[r]) tokens += it.tokens;
    }
    for (int i = 0; i < n; ++i) {
      double slowest = 0;
      for (const auto& rank : run->per_rank) slowest = std::max(slowest, rank[i].iteration_ms);
      measured += slowest;
      predicted += run->predicted_ms[i];
      micro_batches += run->micro_batches[i];
      efficiency += run->padding_efficiency[i];
    }
    if (const int every = absl::GetFlag(FLAGS_curve); every > 0) {
      for (int i = 0; i < n; i += every) std::printf("  %s iteration %d loss %.4f\n", m.c_str(), i, run->per_rank[0][i].loss);
    }
    std::printf("%-8s %12.0f %14.1f %14.1f %8.1f %7.0f%% %10.4f %10.4f\n", m.c_str(), tokens / run->wall_s,
                measured / n, predicted / n, micro_batches / n, 100 * (1 - efficiency / n),
                run->per_rank[0].front().loss, run->per_rank[0].back().loss);
    std::fflush(stdout);
  }
  return 0;
}
