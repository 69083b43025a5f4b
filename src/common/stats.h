#pragma once

// Summaries of measured samples (timings), for reports and profiles.

#include <vector>

namespace dynapipe {

// 0 for no samples; the mean of the two middle ones for an even count.
double Median(std::vector<double> v);
// The sample nearest rank p * (n - 1), p in [0, 1]; 0 for no samples.
double Percentile(std::vector<double> v, double p);

}  // namespace dynapipe
