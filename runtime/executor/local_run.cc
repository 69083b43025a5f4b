#include "runtime/executor/local_run.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "planner/service/job_runtime.h"
#include "runtime/backend/backend.h"
#include "runtime/comm/kv_store.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::executor {

absl::StatusOr<LocalRunResult> RunLocal(const proto::JobSpec& spec, const std::string& data_root, int64_t count,
                                        WorkerOptions options, BackendOptions backend_options) {
  ASSIGN_OR_RETURN(auto rt, planner::service::BuildJobRuntime(spec, "local", data_root));
  ASSIGN_OR_RETURN(const std::string dataset_path, ConfinedPath(data_root, rt->spec.dataset().path()));
  ASSIGN_OR_RETURN(std::unique_ptr<data::Dataset> dataset, data::Dataset::Open(dataset_path));
  const int world = rt->world();
  const int pp = rt->planner->config().pp, dp = rt->planner->config().dp;
  LocalRunResult out;
  std::vector<std::vector<proto::ExecutionPlan>> plans;  // [iteration][rank]
  for (int64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(planner::IterationPlan p, rt->planner->Plan(rt->batch(i), i));
    out.predicted_ms.push_back(p.predicted_ms);
    int micro_batches = 0;
    for (const auto& g : p.groups) micro_batches += static_cast<int>(g.size());
    out.micro_batches.push_back(micro_batches);
    out.padding_efficiency.push_back(p.padding_efficiency);
    plans.push_back(std::move(p.plans));
  }
  comm::MemoryKeyValueStore kv;
  out.per_rank.resize(world);
  out.final_params.resize(world);
  std::vector<absl::Status> status(world);
  std::vector<std::thread> threads;
  std::vector<double> wall(world, 0);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      status[r] = [&]() -> absl::Status {
        // One backend per rank, as one per executor process.
        ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(backend_options));
        RETURN_IF_ERROR(backend->BindThread());
        ASSIGN_OR_RETURN(auto comm, backend->Connect({.rank = r, .size = world, .job_prefix = "local/"}, &kv));
        const auto& layers = plans[0][r].layers();
        ASSIGN_OR_RETURN(auto worker, Worker::Create(rt->spec, std::vector<int32_t>(layers.begin(), layers.end()), r, pp,
                                                     dp, comm.get(), dataset.get(), backend.get(), options));
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < count; ++i) {
          ASSIGN_OR_RETURN(IterationResult res, worker->RunIteration(plans[i][r]));
          out.per_rank[r].push_back(std::move(res));
        }
        wall[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (const auto& c : worker->chunks()) {
          model::StageState state;
          RETURN_IF_ERROR(c->ExportState(&state));
          out.final_params[r].insert(out.final_params[r].end(), state.params.begin(), state.params.end());
        }
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) RETURN_IF_ERROR(status[r]);
  out.wall_s = *std::max_element(wall.begin(), wall.end());
  return out;
}

}  // namespace dynapipe::runtime::executor
