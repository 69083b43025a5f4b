#pragma once

// The planner's status endpoint: /status (JSON) and /metrics (Prometheus
// text) from the jobs and executors the service gathered within its status
// budget (from the store, or its last known state when the store is slow).
// Own lock: one metrics scrape at a time (the per-job series are rebuilt).

#include <cstdint>
#include <string>
#include <vector>

#include "planner/service/job_runtimes.h"
#include "proto/services.pb.h"
#include "src/common/json_writer.h"
#include "src/common/mutex.h"
#include "src/http/metrics.h"

namespace dynapipe::planner::service {

struct StatusInputs {
  std::vector<proto::JobStatus> jobs;
  std::vector<proto::ExecutorRecord> executors;
  int64_t stale_ms = 0;  // > 0: jobs and executors are the last known state, that old
  int64_t now_ms = 0;
  std::string owner;
  bool healthy = true;
  int64_t redis_errors = 0;
  std::string store_id;
  int64_t store_losses = 0;  // times the store's data was found gone
  std::string notice;        // said after a store lost jobs, else ""
};

class StatusView {
 public:
  StatusView(http::Metrics* metrics, const JobRuntimes* runtimes) : metrics_(metrics), runtimes_(runtimes) {}

  // Every active job and the newest kEndedJobs that ended (`dynapipe list
  // --all` lists them all), and every executor.
  static constexpr size_t kEndedJobs = 50;
  std::string Json(const StatusInputs& in) const;
  std::string MetricsText(const StatusInputs& in);

 private:
  void JobJson(const proto::JobStatus& s, JsonWriter& w) const;
  // The job's "refit" member, when its cost refit is on and loaded here.
  void RefitJson(const std::string& job, JsonWriter& w) const;
  // Sets the per-job series of an active job (progress, loss, tokens/s, MFU,
  // predicted and measured iteration seconds).
  void JobMetrics(const proto::JobStatus& s);

  http::Metrics* const metrics_;
  const JobRuntimes* const runtimes_;
  Mutex scrape_mu_;
};

}  // namespace dynapipe::planner::service
