#pragma once

// Builds a Planner from `dynapipe plan` flags: model (a config file or a name
// under configs/models), cluster, cost model (measured profile or analytic
// from a device), parallelism, batching and schedule choices.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "planner/planner.h"
#include "cli/args.h"

namespace dynapipe::cli {

struct PlanSetup {
  planner::PlannerConfig config;
  std::shared_ptr<const planner::LayerCostModel> cost;
  std::string cost_description;
};

// INVALID_ARGUMENT / NOT_FOUND name the flag or file at fault.
absl::StatusOr<PlanSetup> SetupFromArgs(const Args& args);

// The analytic device presets accepted by --device (h100, h200, a100, cpu).
absl::StatusOr<proto::DeviceSpec> DevicePreset(const std::string& name);

}  // namespace dynapipe::cli
