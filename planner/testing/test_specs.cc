#include "planner/testing/test_specs.h"

namespace dynapipe::planner::testing {

proto::ModelSpec Gpt(int layers, int hidden, int heads) {
  proto::ModelSpec m;
  m.set_kind(proto::ModelKind::gpt);
  m.set_num_layers(layers);
  m.set_hidden(hidden);
  m.set_heads(heads);
  m.set_ffn(4 * hidden);
  m.set_vocab(32000);
  m.set_max_positions(8192);
  m.set_dtype(proto::DType::bf16);
  return m;
}

proto::ModelSpec Gpt67b() {
  proto::ModelSpec m = Gpt(32, 4096, 32);
  m.set_name("gpt-6.7b");
  m.set_vocab(50304);
  return m;
}

proto::DeviceSpec H100() {
  proto::DeviceSpec d;
  d.set_name("h100");
  d.set_peak_tflops(989);
  d.set_memory_bandwidth_gbps(3350);
  d.set_memory_mb(80000);
  return d;
}

proto::ClusterSpec H100Cluster() {
  proto::ClusterSpec c;
  c.set_devices_per_node(8);
  *c.mutable_device() = H100();
  c.set_intra_node_bandwidth_gbps(2400);
  c.set_inter_node_bandwidth_gbps(400);
  c.set_intra_node_latency_us(5);
  c.set_inter_node_latency_us(10);
  return c;
}

}  // namespace dynapipe::planner::testing
