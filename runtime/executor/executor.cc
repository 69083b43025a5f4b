#include "runtime/executor/executor.h"

#include <optional>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "src/checkpoint/checkpoint.h"
#include "runtime/comm/comm.h"
#include "src/data/dataset.h"
#include "runtime/executor/checkpointer.h"
#include "runtime/executor/plan_prefetcher.h"
#include "runtime/executor/worker.h"
#include "src/common/file_util.h"
#include "src/common/json_writer.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::runtime::executor {
namespace {

// The job's bootstrap exchange (planner RPC, kept in Redis) as Gloo's
// rendezvous store.
class BootstrapStore final : public comm::KeyValueStore {
 public:
  BootstrapStore(rpc::PlannerClient* client, std::string job) : client_(client), job_(std::move(job)) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return client_->BootstrapSet(job_, std::string(key), std::string(value));
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration wait) override {
    return client_->BootstrapGet(job_, std::string(key), wait);
  }

 private:
  rpc::PlannerClient* client_;
  std::string job_;
};

constexpr absl::Duration kPlanWait = absl::Seconds(5);  // per FetchPlan call; bounds an abort's latency

}  // namespace

Executor::Executor(ExecutorOptions options, std::unique_ptr<Backend> backend)
    : options_(std::move(options)), backend_(std::move(backend)) {
  DP_CHECK(backend_ != nullptr);
  backend_description_ = backend_->Describe();
}

Executor::~Executor() {
  Shutdown();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Executor::Shutdown() {
  int64_t unset = 0;
  stopping_since_ns_.compare_exchange_strong(unset, absl::ToUnixNanos(absl::Now()));
  stopping_ = true;
  AbortJob("executor shutting down");
  // Calls waiting for a planner that is down end now, and so do retries.
  MutexLock l(&mu_);
  if (client_ != nullptr) client_->Shutdown();
}

void Executor::AbortJob(const std::string& why) {
  MutexLock l(&mu_);
  if (running_job_.empty()) return;
  if (!stop_job_) {
    if (running_job_iterations_ > 0 && last_iteration_ + 1 >= running_job_iterations_) {
      spdlog::info("job {}: ended after its last iteration", running_job_);  // the normal end, not a failure
    } else {
      spdlog::warn("job {}: stopping: {}", running_job_, why);
    }
  }
  stop_job_ = true;
  if (comm_ != nullptr) comm_->Abort();
}

absl::Status Executor::RegisterOnce() {
  proto::RegisterExecutorRequest req;
  req.set_node(options_.node);
  req.set_device_index(options_.device);
  req.set_backend(backend_->kind());
  req.set_address(options_.listen_address);
  ASSIGN_OR_RETURN(const proto::RegisterExecutorResponse resp, client_->Register(req));
  // Every later call proves it comes from this executor (a new identity
  // after each registration; the secret is never logged).
  client_->SetExecutorCredential({resp.executor_id(), resp.executor_secret()});
  MutexLock l(&mu_);
  executor_id_ = resp.executor_id();
  heartbeat_interval_ = absl::Milliseconds(std::max<int64_t>(50, resp.heartbeat_interval_ms()));
  last_heartbeat_ok_ = absl::Now();
  spdlog::info("registered as {} with the planner at {}; peers reach it at {}", executor_id_, options_.planner.address,
               options_.listen_address);
  return absl::OkStatus();
}

absl::Status Executor::Run() {
  rpc::PlannerClient::Options planner = options_.planner;
  planner.wait_for_ready = true;  // an executor rides through planner restarts
  ASSIGN_OR_RETURN(std::unique_ptr<rpc::PlannerClient> client, rpc::PlannerClient::Connect(planner));
  {
    // Published under the lock for Shutdown, which may run on another thread.
    MutexLock l(&mu_);
    client_ = std::move(client);
    if (stopping_) client_->Shutdown();
  }
  absl::Duration backoff = absl::Milliseconds(200);
  while (!stopping_) {
    const absl::Status s = RegisterOnce();
    if (s.ok()) break;
    if (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kUnauthenticated ||
        s.code() == absl::StatusCode::kPermissionDenied) {
      return s;
    }
    if (stopping_) break;
    spdlog::warn("registering with {}: {} (retrying in {} ms)", options_.planner.address, s.message(),
                 absl::ToInt64Milliseconds(backoff));
    MutexLock l(&mu_);
    mu_.AwaitWithDeadline([this] { return stopping_.load(); }, absl::Now() + backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  std::string finished;  // the last job this executor ran (its assignment may linger one heartbeat)
  while (!stopping_) {
    proto::Assignment a;
    {
      MutexLock l(&mu_);
      mu_.AwaitWithDeadline(
          [&] {
            return stopping_ || (!assignment_.job_id().empty() && assignment_.job_id() != finished &&
                                 assignment_.peer_executor_ids_size() == assignment_.world_size());
          },
          absl::Now() + absl::Milliseconds(200));
      if (stopping_ || assignment_.job_id().empty() || assignment_.job_id() == finished ||
          assignment_.peer_executor_ids_size() != assignment_.world_size()) {
        continue;
      }
      a = assignment_;
      running_job_ = a.job_id();
      running_job_iterations_ = -1;
      last_iteration_ = a.start_iteration() - 1;
      stop_job_ = false;
      last_error_.clear();
    }
    spdlog::info("job {}: rank {} of {} (pp rank {}, dp rank {}), from iteration {}", a.job_id(), a.rank(),
                 a.world_size(), a.pp_rank(), a.dp_rank(), a.start_iteration());
    // The last job's series stay until the next job starts.
    if (!metrics_job_.empty() && metrics_job_ != a.job_id()) metrics_.ClearAll({{"job", metrics_job_}});
    metrics_job_ = a.job_id();
    const absl::Status s = RunJob(a);
    if (options_.after_job_for_test) options_.after_job_for_test();
    MutexLock l(&mu_);
    if (s.ok()) {
      spdlog::info("job {}: done on this executor", a.job_id());
    } else {
      spdlog::error("job {}: {}", a.job_id(), s.message());
      last_error_ = std::string(s.message());
    }
    finished = a.job_id();
    running_job_.clear();
    comm_ = nullptr;
  }
  return absl::OkStatus();
}

void Executor::HeartbeatLoop() {
  while (!stopping_) {
    std::string id;
    absl::Duration interval;
    int64_t iteration;
    {
      MutexLock l(&mu_);
      id = executor_id_;
      interval = heartbeat_interval_;
      iteration = last_iteration_;
    }
    proto::HeartbeatRequest req;
    req.set_executor_id(id);
    req.set_iteration(iteration);
    auto resp = client_->Heartbeat(req);
    if (!resp.ok()) {
      // Unknown id (the store lost it) or a secret it no longer accepts (a
      // record written over): only a new registration helps.
      if (resp.status().code() == absl::StatusCode::kNotFound ||
          resp.status().code() == absl::StatusCode::kUnauthenticated) {
        spdlog::warn("planner does not accept executor {} ({}): registering again", id, resp.status().message());
        AbortJob("the planner lost this executor's registration");
        (void)RegisterOnce();
      } else {
        spdlog::warn("heartbeat: {}", resp.status().message());
      }
    } else {
      if (resp->stop()) AbortJob("the planner ended the job (failed, cancelled or this executor was given up on)");
      MutexLock l(&mu_);
      last_heartbeat_ok_ = absl::Now();
      assignment_ = resp->assignment();
    }
    for (absl::Duration slept; slept < interval && !stopping_; slept += absl::Milliseconds(20)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
}

void Executor::ReportFailure(const proto::Assignment& a, int64_t iteration, const absl::Status& s) {
  {
    MutexLock l(&mu_);
    if (stop_job_) return;  // the job already ended elsewhere; this is the fallout
  }
  proto::IterationReport r;
  r.set_job_id(a.job_id());
  r.set_iteration(iteration);
  r.set_rank(a.rank());
  r.set_error(std::string(s.message()));
  if (const std::optional<int> peer = comm::LostPeer(s); peer.has_value()) r.set_lost_peer(*peer);
  if (auto rs = client_->ReportIteration(r); !rs.ok()) spdlog::error("reporting the failure: {}", rs.message());
}

absl::Status Executor::RunJob(const proto::Assignment& a) {
  try {
    return RunJobSteps(a);
  } catch (const std::bad_alloc&) {
    // Allocations that say what they were for fail with a Status of their
    // own (the stages, the checkpoint's copy); this is any other. The job
    // fails, the executor stays.
    int64_t iteration;
    {
      MutexLock l(&mu_);
      iteration = last_iteration_ + 1;
    }
    const absl::Status s = absl::ResourceExhaustedError(absl::StrCat(
        "rank ", a.rank(), " (pipeline stage ", a.pp_rank(), "): out of host memory (an allocation failed) in iteration ",
        iteration));
    ReportFailure(a, iteration, s);
    return s;
  }
}

// What a running job's iterations work with (RunJobSteps owns all of it).
struct Executor::RunningJob {
  const proto::Assignment& assignment;
  const spec::NormalizedJobSpec& spec;
  const std::string& ckpt_dir;
  Worker& worker;
  Checkpointer& checkpointer;
};

namespace {

// The checkpoint shard of the rank `a` assigns, as its first plan places it.
checkpoint::ShardInfo ShardInfoOf(const proto::Assignment& a, const proto::ExecutionPlan& first,
                                  const spec::NormalizedJobSpec& spec) {
  checkpoint::ShardInfo info;
  info.rank = a.rank();
  info.pp_rank = first.pp_rank();
  info.dp_rank = first.dp_rank();
  info.world = a.world_size();
  info.job_fingerprint = checkpoint::JobFingerprint(spec);
  return info;
}

// This rank's report of one iteration (the result's timings move into it).
proto::IterationReport IterationReportOf(const proto::Assignment& a, int64_t iteration,
                                         const proto::ExecutionPlan& plan, IterationResult& result) {
  const std::string& job = a.job_id();
  proto::IterationReport r;
  r.set_job_id(job);
  r.set_iteration(iteration);
  r.set_rank(a.rank());
  r.set_iteration_ms(result.iteration_ms);
  r.set_predicted_iteration_ms(plan.predicted_iteration_ms());
  r.set_peak_memory_mb(result.peak_memory_mb);
  r.set_peak_reserved_mb(result.peak_reserved_mb);
  r.set_peak_class_mb(result.peak_class_mb);
  r.set_memory_fragmentation(result.memory_fragmentation);
  r.set_loss(result.loss);
  r.set_lr(result.lr);
  r.set_grad_norm(result.grad_norm);
  r.set_tokens(result.tokens);
  for (auto& t : result.timings) *r.add_timings() = std::move(t);
  if (r.ByteSizeLong() > rpc::kMaxPlannerRequestBytes / 2) {
    // The timings are feedback only; the report itself must get through.
    spdlog::warn("job {} iteration {}: {} instruction timings exceed the report size limit: not sent", job,
                 iteration, r.timings_size());
    r.clear_timings();
  }
  return r;
}

}  // namespace

absl::Status Executor::RunJobSteps(const proto::Assignment& a) {
  const std::string& job = a.job_id();
  int64_t iteration = a.start_iteration();
  // Failures before and during training are reported, so the planner fails
  // the job and every other rank stops too.
  auto fail = [&](absl::Status s) {
    ReportFailure(a, iteration, s);
    return s;
  };
  absl::StatusOr<JobInputs> inputs = LoadJob(a);
  if (!inputs.ok()) return fail(inputs.status());
  const spec::NormalizedJobSpec& spec = inputs->spec;

  BootstrapStore store(client_.get(), job);
  auto comm = ConnectJob(a, &store);
  if (!comm.ok()) return fail(comm.status());
  // The heartbeat thread may abort the communicator until it is unpublished,
  // which happens before it is destroyed, whatever way this function ends.
  struct Unpublish {
    Executor* self;
    ~Unpublish() {
      MutexLock l(&self->mu_);
      self->comm_ = nullptr;
    }
  } unpublish{this};

  PlanPrefetcher plans(
      job, a.rank(), [this, job, rank = a.rank()](int64_t i) { return client_->FetchPlan(job, i, rank, kPlanWait); },
      spec->iterations(), options_.prefetch,
      [this] {
        MutexLock l(&mu_);
        return stop_job_;
      },
      options_.planner.timeout);
  const int64_t first_iteration = iteration;
  auto first = plans.Next(iteration);
  if (!first.ok()) return fail(Annotate(first.status(), absl::StrCat("plan of iteration ", iteration)));
  const std::vector<int32_t> layers(first->layers().begin(), first->layers().end());
  // Pretrained weights only for a fresh start: a resumed job's come from its checkpoint.
  auto worker = CreateWorker(a, spec, *first, layers, comm->get(), inputs->dataset.get(),
                             first_iteration == 0 ? inputs->init_from : std::string());
  if (!worker.ok()) return fail(worker.status());

  // A shard being written when the executor shuts down gets a grace to
  // finish (a checkpoint missing one rank's shard cannot be resumed from);
  // past it, it is discarded (the previous checkpoint stays the latest
  // complete one) instead of holding up the exit.
  Checkpointer checkpointer(inputs->ckpt_dir, ShardInfoOf(a, *first, spec), [this] {
    const int64_t since = stopping_since_ns_.load();
    return since != 0 && absl::Now() - absl::FromUnixNanos(since) > kCheckpointShutdownGrace;
  });
  if (first_iteration == 0 && !inputs->init_from.empty()) {
    spdlog::info("job {}: started from the Hugging Face weights in {}", job, inputs->init_from);
  }
  if (first_iteration > 0) {
    // Resume: the planner started this job after the latest complete checkpoint.
    if (auto s = checkpointer.Restore(first_iteration - 1, **worker); !s.ok()) return fail(Annotate(s, "resuming"));
    spdlog::info("job {}: resumed from the checkpoint of iteration {} in {}", job, first_iteration - 1,
                 inputs->ckpt_dir);
  }

  const RunningJob running{a, spec, inputs->ckpt_dir, **worker, checkpointer};
  for (; iteration < spec->iterations(); ++iteration) {
    absl::StatusOr<proto::ExecutionPlan> plan = iteration == first_iteration ? std::move(first) : plans.Next(iteration);
    if (!plan.ok()) return fail(Annotate(plan.status(), absl::StrCat("plan of iteration ", iteration)));
    if (!std::equal(plan->layers().begin(), plan->layers().end(), layers.begin(), layers.end())) {
      return fail(absl::FailedPreconditionError(absl::StrCat("iteration ", iteration, ": the plan moves layers")));
    }
    auto result = (*worker)->RunIteration(*plan);
    if (!result.ok()) return fail(result.status());
    if (iteration + 1 == spec->iterations() && !inputs->export_dir.empty()) {
      // Before the last iteration is reported: a job that succeeded has its export.
      if (auto s = (*worker)->ExportHuggingFace(inputs->export_dir); !s.ok()) return fail(Annotate(s, "export"));
      spdlog::info("job {}: exported the trained model to {}", job, inputs->export_dir);
    }
    if (auto s = CompleteIteration(running, iteration, *plan, *result); !s.ok()) return fail(s);
  }
  if (auto s = checkpointer.Wait(); !s.ok()) return fail(Annotate(s, "checkpoint"));
  return absl::OkStatus();
}

absl::StatusOr<Executor::JobInputs> Executor::LoadJob(const proto::Assignment& a) {
  if (auto s = backend_->BindThread(); !s.ok()) return s;
  auto status = client_->Get(a.job_id());
  if (!status.ok()) return status.status();
  // The stored spec is normalised where it is loaded.
  auto normalized = spec::NormalizedJobSpec::Normalize(status->spec());
  if (!normalized.ok()) return normalized.status();
  JobInputs in(std::move(*normalized));
  {
    MutexLock l(&mu_);
    running_job_iterations_ = in.spec->iterations();
  }
  // Paths stay under --data_root here too, whatever the planner let through.
  auto paths = spec::ConfineJobPaths(in.spec, options_.data_root);
  if (!paths.ok()) return paths.status();
  in.ckpt_dir = paths->checkpoint_dir;
  in.init_from = paths->init_from;
  in.export_dir = paths->export_dir;
  // Links inside the directory lead nowhere else.
  if (auto s = data::CheckDatasetConfined(options_.data_root, paths->dataset); !s.ok()) {
    return Annotate(s, "dataset.path");
  }
  auto dataset = data::Dataset::Open(paths->dataset);
  if (!dataset.ok()) return Annotate(dataset.status(), "dataset");
  in.dataset = std::move(*dataset);
  return in;
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> Executor::ConnectJob(const proto::Assignment& a,
                                                                         comm::KeyValueStore* store) {
  ConnectOptions co;
  co.rank = a.rank();
  co.size = a.world_size();
  co.job_prefix = "comm/";
  co.listen_address = options_.listen_address;
  co.connect_timeout = options_.connect_timeout;
  auto comm = backend_->Connect(co, store);
  if (!comm.ok()) return Annotate(comm.status(), absl::StrCat("rank ", a.rank(), ": connecting to the job's ranks"));
  MutexLock l(&mu_);
  comm_ = comm->get();
  if (stop_job_) (*comm)->Abort();
  return comm;
}

absl::StatusOr<std::unique_ptr<Worker>> Executor::CreateWorker(const proto::Assignment& a,
                                                               const spec::NormalizedJobSpec& spec,
                                                               const proto::ExecutionPlan& first,
                                                               std::span<const int32_t> layers,
                                                               comm::Communicator* comm,
                                                               const data::Dataset* dataset,
                                                               const std::string& init_from) {
  WorkerOptions wo;
  wo.init_from = init_from;
  wo.comm_timeout = options_.comm_timeout;
  wo.stopped = [this] {
    MutexLock l(&mu_);
    return stop_job_;
  };
  return Worker::Create(spec, layers, a.rank(), first.pp_size(), first.dp_size(), comm, dataset, backend_.get(), wo);
}

absl::Status Executor::CompleteIteration(const RunningJob& job, int64_t iteration, const proto::ExecutionPlan& plan,
                                         IterationResult& result) {
  const proto::Assignment& a = job.assignment;
  proto::IterationReport r = IterationReportOf(a, iteration, plan, result);
  const int64_t interval = job.spec->checkpoint().interval();
  const bool last = iteration + 1 == job.spec->iterations();
  const bool save = interval > 0 && !job.ckpt_dir.empty() && ((iteration + 1) % interval == 0 || last);
  if (save && last) {
    // The job ends with this report: the shard must be on disk before it.
    absl::Status s = job.checkpointer.Begin(iteration, job.worker);
    if (s.ok()) s = job.checkpointer.Wait();
    if (!s.ok()) return Annotate(s, "checkpoint");
    r.set_checkpoint_written(true);
  }
  if (auto s = client_->ReportIteration(r); !s.ok()) {
    // The job may have ended meanwhile; otherwise this is worth stopping for.
    return Annotate(s, absl::StrCat("reporting iteration ", iteration));
  }
  if (save && !last) {
    // The shard is written while the next iterations train; the writer
    // reports it (the same report, marked) once it is on disk, so the
    // planner never counts a shard that is not there.
    r.set_checkpoint_written(true);
    auto report_written = [this, r] {
      if (auto s = client_->ReportIteration(r); !s.ok()) {
        spdlog::warn("job {}: reporting the checkpoint of iteration {}: {}", r.job_id(), r.iteration(), s.message());
      }
    };
    if (auto s = job.checkpointer.Begin(iteration, job.worker, report_written); !s.ok()) {
      return Annotate(s, "checkpoint");
    }
  }
  RecordIteration(a.job_id(), iteration, job.spec->iterations(), a, result, plan.predicted_iteration_ms(), save);
  return absl::OkStatus();
}

void Executor::RecordIteration(const std::string& job, int64_t iteration, int64_t iterations,
                               const proto::Assignment& a, const IterationResult& result, double predicted_ms,
                               bool checkpoint) {
  const int rank = a.rank();
  const http::Labels labels = {{"job", job}, {"rank", absl::StrCat(rank)}, {"stage", absl::StrCat(a.pp_rank())}};
  metrics_.Add("dynapipe_executor_iterations_total", 1, "Iterations this executor completed", labels);
  metrics_.Add("dynapipe_executor_tokens_total", static_cast<double>(result.tokens), "Real tokens processed", labels);
  metrics_.Set("dynapipe_executor_loss", result.loss, "Training loss of the last iteration", labels);
  metrics_.Set("dynapipe_executor_iteration", static_cast<double>(iteration), "Last iteration completed", labels);
  metrics_.Set("dynapipe_executor_predicted_iteration_seconds", predicted_ms / 1e3,
               "The planner's prediction for the last iteration", labels);
  constexpr double kMiB = 1 << 20;  // IterationResult's "MB" are MiB
  metrics_.Set("dynapipe_executor_peak_memory_bytes", result.peak_memory_mb * kMiB,
               "Peak memory of the last iteration", labels);
  metrics_.Set("dynapipe_executor_peak_reserved_bytes", result.peak_reserved_mb * kMiB,
               "Peak memory the buffer pool held in the last iteration", labels);
  metrics_.Set("dynapipe_executor_memory_fragmentation_ratio", result.memory_fragmentation,
               "Share of the pool's peak reservation never requested", labels);
  metrics_.Observe("dynapipe_executor_iteration_seconds", result.iteration_ms / 1e3,
                   {0.01, 0.05, 0.1, 0.5, 1, 5, 30}, "Measured iteration time", labels);
  const std::string line = absl::StrFormat(
      "job %s iteration %d/%d: loss %.4f, %.0f tokens/s, %.1f ms (planned %.1f ms), peak %.1f MB%s", job,
      iteration + 1, iterations, result.loss, result.tokens / (result.iteration_ms / 1e3), result.iteration_ms,
      predicted_ms, result.peak_memory_mb, checkpoint ? ", checkpoint" : "");
  if (rank == 0) {
    spdlog::info("{}", line);
  } else {
    spdlog::debug("{}", line);
  }
  MutexLock l(&mu_);
  last_iteration_ = iteration;
  last_loss_ = result.loss;
  last_iteration_ms_ = result.iteration_ms;
}

std::string Executor::HealthProblem() const {
  MutexLock l(&mu_);
  if (executor_id_.empty()) return "not registered with the planner";
  if (absl::Now() - last_heartbeat_ok_ > absl::Seconds(30)) return "no heartbeat answered for 30 s";
  return "";
}

std::string Executor::StatusJson() const {
  MutexLock l(&mu_);
  JsonWriter w;
  w.BeginObject().Str("executor_id", executor_id_).Str("node", options_.node).Int("device", options_.device);
  w.Str("backend", backend_description_).Str("state", running_job_.empty() ? "idle" : "running");
  w.Str("job", running_job_).Int("rank", running_job_.empty() ? -1 : assignment_.rank());
  w.Int("last_iteration", last_iteration_).Fixed("last_loss", last_loss_, 6);
  w.Fixed("last_iteration_ms", last_iteration_ms_, 3).Str("last_error", last_error_).EndObject();
  return w.Take();
}

}  // namespace dynapipe::runtime::executor
