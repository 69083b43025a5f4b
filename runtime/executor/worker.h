#pragma once

// One rank's training state and the interpreter of its execution plans: the
// model chunks this device runs (contiguous layer runs of the plan), AdamW
// state, the plan's buffer slots, and pipeline / data-parallel communication.
// Nothing here knows about RPC or Redis: the executor daemon feeds plans in
// and ships reports out, tests drive workers directly.
//
// The interpreter is written against the backend seam only
// (runtime/backend/backend.h: memory, model::Stage, Communicator): the same
// code drives the CPU backend (fp32, Gloo) and a CUDA device (bf16 kernels,
// NCCL). Tensors it moves are the backend's buffers; slot sizes come from the
// plan's tensor shapes and the backend's activation type.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/job.pb.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"
#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "src/data/dataset.h"
#include "runtime/executor/grad_reducer.h"
#include "runtime/model/stage.h"
#include "src/spec/job_spec.h"

namespace dynapipe::runtime::executor {

struct WorkerOptions {
  absl::Duration comm_timeout = comm::kDefaultCommTimeout;  // per transfer wait and per collective
  // Asked before every instruction: once true, the iteration ends CANCELLED
  // at the next instruction instead of running the plan out (a daemon shutting
  // down, a job failed elsewhere). Unset: never.
  std::function<bool()> stopped;
  // Hugging Face weights every stage starts from (model.init_from, confined
  // to the data root; executor/hf_init.h); empty: the seed's.
  std::string init_from;
};

// What one iteration produced on this rank.
struct IterationResult {
  double loss = 0;        // global-batch mean loss (every rank learns it)
  double grad_norm = 0;   // before clipping
  double lr = 0;
  int64_t tokens = 0;     // real tokens this rank processed
  double iteration_ms = 0;  // host time, the device's work included
  double peak_memory_mb = 0;      // requested activation/buffer peak + model and optimizer state
  double peak_reserved_mb = 0;    // the same, with the pool's reservation instead of its requests
  double peak_class_mb = 0;       // the same, with requests rounded up to the pool's size classes
  double memory_fragmentation = 0;  // of the pool's peak reservation (PoolStats::Fragmentation)
  std::vector<proto::InstructionTiming> timings;  // on the backend's clock (device time on CUDA)
  int buckets_started_early = 0;  // gradient buckets whose reduction started during backward
};

class Worker {
 public:
  // The worker reads the normalised spec's plain fields. `layers`: the model layers this rank runs, in order (from its
  // plans). `backend` makes the stages and holds their memory; it and `comm` (made
  // by the same backend) must outlive the worker.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const spec::NormalizedJobSpec& spec,
                                                        std::span<const int32_t> layers,
                                                        int rank, int pp_size, int dp_size, comm::Communicator* comm,
                                                        const data::Dataset* dataset, Backend* backend,
                                                        WorkerOptions options);
  ~Worker();

  // Interprets the plan (it must be this rank's); errors name the iteration,
  // the instruction index and its operation.
  absl::StatusOr<IterationResult> RunIteration(const proto::ExecutionPlan& plan);

  // The model chunks (checkpoints export and import their state).
  const std::vector<std::unique_ptr<model::Stage>>& chunks() const { return chunks_; }
  // The job's trained model in Hugging Face's format to `dir` (export_dir,
  // runtime/model/hf_checkpoint.h): data-parallel group 0's pipeline sums
  // each tensor once (a shared one from one of its holders) into the whole
  // model and its first rank writes it; the other groups return at once.
  // Every rank of group 0 must call it (a collective).
  absl::Status ExportHuggingFace(const std::string& dir);
  int64_t optimizer_step() const { return step_; }
  void set_optimizer_step(int64_t s) { step_ = s; }
  Backend& backend() { return *backend_; }

 private:
  Worker(const proto::JobSpec& spec, int rank, int pp, int dp, comm::Communicator* comm, const data::Dataset* ds,
         Backend* backend, WorkerOptions o);
  struct Iter;  // per-iteration interpreter state
  // RunIteration's phases: checks the plan and sets up `it`; runs every
  // instruction; checks nothing is left in flight at the plan's end.
  absl::Status BeginIteration(const proto::ExecutionPlan& plan, Iter* it);
  absl::Status RunInstructions(const proto::ExecutionPlan& plan, Iter* it, InstructionTimer& timer);
  absl::Status CheckPlanDrained(const Iter& it) const;
  // Aborts the communicator (peers fail fast) and names rank, iteration and
  // instruction `i` (or the end of the plan) in `s`.
  absl::Status FailIteration(const proto::ExecutionPlan& plan, const absl::Status& s, int i);
  // Runs instruction `index`, through one handler per kind below.
  absl::Status Execute(const proto::ExecutionPlan& plan, int index, Iter* it);
  absl::Status RunForward(const proto::ExecutionPlan& plan, const proto::Instruction& ins, Iter* it);
  absl::Status RunBackward(const proto::ExecutionPlan& plan, int index, Iter* it);
  absl::Status StartTransfer(const proto::CommOp& op, bool send, Iter* it);
  // Waits for the transfer pending on slot `id`.
  absl::Status FinishTransfer(int id, Iter* it);
  absl::Status FreeBuffers(const proto::Instruction& ins, Iter* it);
  absl::Status AllReduceGrads(const proto::Instruction& ins, Iter* it);
  // The instruction's chunk, and its micro-batch's tokens (built on first use).
  absl::StatusOr<model::Stage*> ChunkOf(const proto::Instruction& ins);
  absl::StatusOr<const model::TokenBatch*> BatchOf(const proto::ExecutionPlan& plan, const proto::Instruction& ins,
                                                   Iter* it);
  // Slot `id` holding at least `min_bytes`; FreshSlot: an empty slot, given
  // `bytes` from the pool.
  absl::StatusOr<Buffer*> Slot(int id, size_t min_bytes, Iter* it);
  absl::StatusOr<Buffer*> FreshSlot(int id, size_t bytes, Iter* it);
  absl::Status OptimizerStep(const proto::ExecutionPlan& plan, Iter* it);
  // Sums the two copies of a tied embedding's gradient (first and last
  // stage); under ZeRO-1 only the part this rank owns. An encoder-decoder's
  // shared tensors: SumSharedTensors (shared_tensors.h).
  absl::Status ExchangeTiedEmbedding(const proto::ExecutionPlan& plan);
  // The squared gradient norm of this rank's chunks, on data-parallel rank 0
  // (0 elsewhere): per chunk, a sum over every member's shard of every
  // ownership region in offset order, so that sharded and whole optimizers,
  // and any bucket size, agree bit for bit.
  absl::StatusOr<double> GradSumOfSquares();
  // ZeRO-1: every member's updated shards to every member.
  absl::Status GatherParams();
  bool sharded() const { return zero1_ && dp_ > 1; }
  absl::Time Deadline() const { return absl::Now() + options_.comm_timeout; }

  proto::JobSpec spec_;
  int rank_, pp_, dp_;
  comm::Communicator* comm_;
  const data::Dataset* dataset_;
  Backend* backend_;
  WorkerOptions options_;
  std::vector<std::unique_ptr<model::Stage>> chunks_;
  std::vector<std::vector<GradBucket>> buckets_;  // per chunk (grad_reducer.h)
  std::vector<std::vector<GradBucket>> regions_;  // per chunk: ZeRO-1 ownership regions
  std::vector<int> dp_group_;                     // this rank's data-parallel peers, itself included
  int dp_rank_ = 0;
  bool zero1_ = false;
  int64_t step_ = 0;
};

}  // namespace dynapipe::runtime::executor
