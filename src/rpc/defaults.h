#pragma once

// Addresses and ports every daemon and the CLI default to, declared once.
// On a node: the planner serves gRPC on 50051 and its status endpoint on
// 8080; the executor of device i serves its status endpoint on 8081 + i, so
// a Prometheus scrape configuration names fixed ports.

#include <string_view>

#include "absl/time/time.h"

namespace dynapipe::rpc {

// What every listening socket binds by default (status endpoints, Gloo's
// transport): loopback, so nothing is reachable from the network unless an
// operator says so (exposure.h).
inline constexpr std::string_view kLoopbackHost = "127.0.0.1";
inline constexpr std::string_view kDefaultPlannerAddress = "127.0.0.1:50051";
inline constexpr int kPlannerStatusPort = 8080;
inline constexpr int kExecutorStatusPortBase = 8081;

// How long a planner may stay unreachable (a restart, a failover, a network
// blip) before an executor gives up on its job and `dynapipe watch` on its
// stream: executors' --planner-grace-s and watch's --grace-s.
inline constexpr int kDefaultPlannerGraceS = 60;

// Deadline of each call to the planner: PlannerClient::Options and the CLI's
// --timeout-s.
inline constexpr int kDefaultCallTimeoutS = 10;
inline constexpr absl::Duration kDefaultCallTimeout = absl::Seconds(kDefaultCallTimeoutS);

// How often executors send heartbeats: the planner tells each executor at
// registration (ServiceOptions::heartbeat_interval); executors use it until then.
inline constexpr absl::Duration kDefaultHeartbeatInterval = absl::Seconds(1);

// The status port of the executor driving device `device`.
constexpr int ExecutorStatusPort(int device) { return kExecutorStatusPortBase + device; }

}  // namespace dynapipe::rpc
