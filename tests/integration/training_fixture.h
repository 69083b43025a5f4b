#pragma once

// Real training through the daemons: dynapipe-executor processes (CPU
// backend, Gloo) on a planner, a tiny GPT job on a small synthetic dataset,
// and the checkpoints that show two runs ended bit-identically. Shared by the
// executor, multi-host and fault-soak tests.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "proto/job.pb.h"
#include "src/rpc/planner_client.h"
#include "src/testing/redis_server.h"
#include "tests/integration/control_plane_fixture.h"

namespace dynapipe::testing {

// $TEST_TMPDIR, else /tmp.
std::string TmpDir();

struct ExecutorProcessOptions {
  std::string planner;  // host:port, or a list
  int device = 0;
  std::string node = "itest";
  int comm_timeout_s = 20;
  std::vector<std::string> prefix;  // e.g. {"ip", "netns", "exec", "h1"}: run inside a network namespace
  std::vector<std::string> extra;   // more flags
  std::string log_file;             // default: TmpDir()/executor-PID-DEVICE.log
};

// A dynapipe-executor child process (status endpoint off, warnings only).
std::unique_ptr<ChildProcess> StartExecutor(const ExecutorProcessOptions& options);
std::unique_ptr<ChildProcess> StartExecutor(const std::string& planner, int device);

// Redis with its append-only file, a dynapipe-planner process started with
// `planner_flags` and 4 executors (devices 0-3) on it; REQUIREs each to start.
struct ProcessCluster {
  std::unique_ptr<RedisServer> redis;
  std::unique_ptr<PlannerProcess> planner;
  std::string address;  // the planner's (pass --listen=address to a restarted one)
  std::unique_ptr<rpc::PlannerClient> client;
  std::vector<std::unique_ptr<ChildProcess>> executors;
};
ProcessCluster StartProcessCluster(const std::vector<std::string>& planner_flags);

// SIGTERM, then true if the executor exits within `wait`.
bool Stop(ChildProcess* executor, absl::Duration wait);

// A 200-sample synthetic dataset, made once per TmpDir().
std::string Dataset();
// The same, 600 samples of 5 to 127 tokens: micro-batches of many shapes.
std::string WideDataset();

// A 2 (pipeline) x 2 (data-parallel) GPT job on Dataset(), checkpointing
// every `interval` iterations into `ckpt`.
proto::JobSpec TrainJob(int iterations, const std::string& ckpt, int interval);
// The same job with a T5 (2 encoder and 2 decoder layers): inputs to the
// encoder, targets to the decoder.
proto::JobSpec T5TrainJob(int iterations, const std::string& ckpt, int interval);

// The job's status once it has ended, or its last status after `limit`.
proto::JobStatus WaitEnded(rpc::PlannerClient* client, const std::string& job, absl::Duration limit);

// Parameters and Adam first moments of `rank`'s shard at `iteration`;
// empty when the shard cannot be read.
std::vector<float> Params(const std::string& dir, int64_t iteration, int rank);

}  // namespace dynapipe::testing
