#pragma once

// Histogram buckets of the planner's metrics, in seconds.

#include <vector>

namespace dynapipe::planner::service {

// Call and planning latencies.
inline const std::vector<double> kLatencyBuckets = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                    0.05,   0.1,   0.2,   0.5,   1};
// Measured iteration times.
inline const std::vector<double> kIterationBuckets = {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60};

}  // namespace dynapipe::planner::service
