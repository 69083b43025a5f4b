#include "planner/testing/timed_report.h"

namespace dynapipe::planner::testing {

proto::IterationReport TimedReport(const proto::ExecutionPlan& plan,
                                   const std::function<double(const proto::Instruction&)>& ms, double tail_ms) {
  proto::IterationReport r;
  r.set_job_id(plan.job_id());
  r.set_iteration(plan.iteration());
  r.set_rank(plan.rank());
  double t = 0;
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const double d = ms(plan.instructions(i));
    auto* timing = r.add_timings();
    timing->set_index(i);
    timing->set_start_ms(t);
    timing->set_end_ms(t + d);
    t += d;
  }
  r.set_iteration_ms(t + tail_ms);
  return r;
}

}  // namespace dynapipe::planner::testing
