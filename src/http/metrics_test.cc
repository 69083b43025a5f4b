// The registry's exposition text: one HELP/TYPE per family, labelled series,
// escaping, counters set from a running total, clearing by label, labelled
// histograms, and this process's own series.
#include "src/http/metrics.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace dynapipe::http {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("Families render once with every labelled series; label values are escaped") {
  Metrics m;
  m.Set("dynapipe_job_loss", 2.5, "Loss", {{"job", "a"}});
  m.Set("dynapipe_job_loss", 1.25, "Loss", {{"job", "b\"x\\y\nz"}});
  m.Add("dynapipe_tokens_total", 100, "Tokens", {{"job", "a"}});
  m.Add("dynapipe_tokens_total", 20, "", {{"job", "a"}});
  m.SetTotal("dynapipe_redis_errors_total", 7, "Errors");
  const std::string text = m.Render();
  CHECK_THAT(text, Contains("# HELP dynapipe_job_loss Loss\n# TYPE dynapipe_job_loss gauge\n"
                            "dynapipe_job_loss{job=\"a\"} 2.5\n"
                            "dynapipe_job_loss{job=\"b\\\"x\\\\y\\nz\"} 1.25\n"));
  CHECK_THAT(text, Contains("# TYPE dynapipe_tokens_total counter\ndynapipe_tokens_total{job=\"a\"} 120\n"));
  CHECK_THAT(text, Contains("dynapipe_redis_errors_total 7\n"));
  // Clearing by label drops only the matching series; a family left empty
  // renders nothing.
  m.Clear("dynapipe_job_loss", {{"job", "a"}});
  CHECK_THAT(m.Render(), !Contains("job=\"a\"} 2.5") && Contains("dynapipe_job_loss{job=\"b"));
  m.Clear("dynapipe_job_loss");
  CHECK_THAT(m.Render(), !Contains("dynapipe_job_loss"));
  // Everything of one job, across families.
  m.Set("dynapipe_job_loss", 1, "Loss", {{"job", "a"}});
  m.Set("dynapipe_job_loss", 2, "Loss", {{"job", "c"}});
  m.ClearAll({{"job", "a"}});
  CHECK_THAT(m.Render(), !Contains("job=\"a\"") && Contains("dynapipe_job_loss{job=\"c\"} 2\n") &&
                             Contains("dynapipe_redis_errors_total 7\n"));
  // The text format's spellings of non-finite values.
  m.Set("dynapipe_x", std::numeric_limits<double>::infinity());
  m.Set("dynapipe_y", std::nan(""));
  CHECK_THAT(m.Render(), Contains("dynapipe_x +Inf\n") && Contains("dynapipe_y NaN\n"));
}

TEST_CASE("Labelled histograms put le last and count cumulatively") {
  Metrics m;
  for (double v : {0.0004, 0.003, 2.0}) m.Observe("dynapipe_x_seconds", v, {0.001, 0.01}, "X", {{"job", "a"}});
  const std::string text = m.Render();
  CHECK_THAT(text, Contains("dynapipe_x_seconds_bucket{job=\"a\",le=\"0.001\"} 1\n"
                            "dynapipe_x_seconds_bucket{job=\"a\",le=\"0.01\"} 2\n"
                            "dynapipe_x_seconds_bucket{job=\"a\",le=\"+Inf\"} 3\n"
                            "dynapipe_x_seconds_sum{job=\"a\"} 2.0034\n"
                            "dynapipe_x_seconds_count{job=\"a\"} 3\n"));
}

TEST_CASE("Process series and build info describe this process") {
  const std::string text = ProcessMetricsText("dynapipe");
  CHECK_THAT(text, Contains("# TYPE process_cpu_seconds_total counter\n") &&
                       Contains("# TYPE process_resident_memory_bytes gauge\n") &&
                       Contains("process_start_time_seconds ") && Contains("process_open_fds ") &&
                       Contains("process_max_fds ") && Contains("dynapipe_build_info{version=\""));
  const size_t at = text.find("\nprocess_resident_memory_bytes ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(text.substr(at + 31)) > 1e5);  // a running test binary holds more than 100 kB
}

}  // namespace
}  // namespace dynapipe::http
