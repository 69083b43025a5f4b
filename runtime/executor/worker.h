#pragma once

// One rank's training state and the interpreter of its execution plans: the
// model chunks this device runs (contiguous layer runs of the plan), AdamW
// state, the plan's buffer slots, and pipeline / data-parallel communication.
// Nothing here knows about RPC or Redis: the executor daemon feeds plans in
// and ships reports out, tests drive workers directly.
//
// The interpreter is written against the Communicator and BufferPool
// interfaces only; a CUDA backend swaps the allocator, the kernels behind
// GptStage and the communicator (NCCL) without touching the instruction
// semantics here.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/job.pb.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"
#include "runtime/comm/comm.h"
#include "runtime/data/dataset.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/gpt.h"

namespace dynapipe::runtime::executor {

struct WorkerOptions {
  absl::Duration comm_timeout = absl::Seconds(60);  // per transfer wait and per collective
};

// What one iteration produced on this rank.
struct IterationResult {
  double loss = 0;        // global-batch mean loss (every rank learns it)
  double grad_norm = 0;   // before clipping
  double lr = 0;
  int64_t tokens = 0;     // real tokens this rank processed
  double iteration_ms = 0;
  double peak_memory_mb = 0;      // requested activation/buffer peak + model and optimizer state
  double peak_reserved_mb = 0;    // the same, with the pool's reservation instead of its requests
  double memory_fragmentation = 0;  // of the pool's peak reservation (PoolStats::Fragmentation)
  std::vector<proto::InstructionTiming> timings;
};

class Worker {
 public:
  // `layers`: the model layers this rank runs, in order (from its plans).
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const proto::JobSpec& spec, std::span<const int32_t> layers,
                                                        int rank, int pp_size, int dp_size, comm::Communicator* comm,
                                                        const data::Dataset* dataset, WorkerOptions options);
  ~Worker();

  // Interprets the plan (it must be this rank's); errors name the iteration,
  // the instruction index and its operation.
  absl::StatusOr<IterationResult> RunIteration(const proto::ExecutionPlan& plan);

  // Model and optimizer state, for checkpoints: per chunk, parameters and
  // the two AdamW moments, named like the parameters.
  const std::vector<std::unique_ptr<model::GptStage>>& chunks() const { return chunks_; }
  std::vector<std::vector<float>>& adam_m() { return m_; }
  std::vector<std::vector<float>>& adam_v() { return v_; }
  int64_t optimizer_step() const { return step_; }
  void set_optimizer_step(int64_t s) { step_ = s; }
  std::span<float> params(size_t chunk) { return chunks_[chunk]->param_data(); }
  BufferPool& pool() { return pool_; }

 private:
  Worker(const proto::JobSpec& spec, int rank, int pp, int dp, comm::Communicator* comm, const data::Dataset* ds,
         WorkerOptions o);
  struct Iter;  // per-iteration interpreter state
  absl::Status Execute(const proto::ExecutionPlan& plan, int index, Iter* it);
  absl::Status OptimizerStep(const proto::ExecutionPlan& plan, Iter* it);
  absl::Status ExchangeTiedEmbedding(const proto::ExecutionPlan& plan, Iter* it);
  absl::Time Deadline() const { return absl::Now() + options_.comm_timeout; }

  proto::JobSpec spec_;
  int rank_, pp_, dp_;
  comm::Communicator* comm_;
  const data::Dataset* dataset_;
  WorkerOptions options_;
  BufferPool pool_;
  std::vector<std::unique_ptr<model::GptStage>> chunks_;
  std::vector<std::vector<float>> m_, v_;
  int64_t step_ = 0;
};

}  // namespace dynapipe::runtime::executor
