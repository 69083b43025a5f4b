#pragma once

// Transfer times between devices from the ClusterSpec: latency + bytes /
// bandwidth, intra- or inter-node. Global rank = dp_rank * pp + pp_rank and
// ranks fill nodes in order.

#include "proto/cluster.pb.h"

namespace dynapipe::planner {

class CommModel {
 public:
  explicit CommModel(const proto::ClusterSpec& cluster) : cluster_(cluster) {}

  bool SameNode(int rank_a, int rank_b) const {
    const int per_node = cluster_.devices_per_node() > 0 ? cluster_.devices_per_node() : 1;
    return rank_a / per_node == rank_b / per_node;
  }
  // Milliseconds to move `mb` megabytes from rank a to rank b.
  double TransferMs(int rank_a, int rank_b, double mb) const {
    const bool intra = SameNode(rank_a, rank_b);
    const double gbps = intra ? cluster_.intra_node_bandwidth_gbps() : cluster_.inter_node_bandwidth_gbps();
    const double lat_us = intra ? cluster_.intra_node_latency_us() : cluster_.inter_node_latency_us();
    return lat_us / 1e3 + (gbps > 0 ? mb * 8.0 / gbps : 0.0);
  }
  // Ring all-reduce of `mb` megabytes over `ranks` (2 (n-1)/n of the data
  // crosses the slowest link, in 2 (n-1) latency-bound steps).
  template <typename Ranks>
  double AllReduceMs(const Ranks& ranks, double mb) const {
    const int n = static_cast<int>(ranks.size());
    if (n <= 1) return 0;
    bool intra = true;
    for (int r : ranks) intra = intra && SameNode(r, ranks[0]);
    const double gbps = intra ? cluster_.intra_node_bandwidth_gbps() : cluster_.inter_node_bandwidth_gbps();
    const double lat_us = intra ? cluster_.intra_node_latency_us() : cluster_.inter_node_latency_us();
    return 2.0 * (n - 1) * lat_us / 1e3 + (gbps > 0 ? 2.0 * (n - 1) / n * mb * 8.0 / gbps : 0.0);
  }

 private:
  proto::ClusterSpec cluster_;
};

}  // namespace dynapipe::planner
