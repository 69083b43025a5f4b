#pragma once

// Model, device and cluster specs shared by planner tests and benchmarks.

#include "proto/cluster.pb.h"
#include "proto/model.pb.h"

namespace dynapipe::planner::testing {

// A bf16 GPT with ffn = 4 * hidden, vocab 32000, 8192 positions.
proto::ModelSpec Gpt(int layers, int hidden, int heads);
// GPT-6.7B-like: 32 layers, hidden 4096, 32 heads, ffn 16384, vocab 50304.
proto::ModelSpec Gpt67b();
// H100 SXM figures for the analytic model: 989 dense bf16 TFLOP/s, 3350 GB/s, 80 GB.
proto::DeviceSpec H100();
// 8 devices per node, NVLink-class 2400 Gbit/s inside, 400 Gbit/s across.
proto::ClusterSpec H100Cluster();

}  // namespace dynapipe::planner::testing
