#pragma once

// `dynapipe profile`: measures the job's model with the executor's own
// kernels and writes the cost profile its planner uses
// (JobSpec.cost_profile_path). The `dynapipe` client profiles on the CPU;
// `dynapipe-gpu-profile` (CUDA builds) runs the same command with the CUDA
// backend too (--device cuda, its default).

#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cost_profile.pb.h"
#include "runtime/model/gpt.h"
#include "runtime/model/profile.h"

namespace dynapipe::cli {

using Profiler = std::function<absl::StatusOr<proto::CostProfile>(const runtime::model::GptConfig&,
                                                                  const runtime::model::ProfileOptions&)>;

// Profilers by --device name; the first argument is used without --device.
struct ProfileBackends {
  std::string default_device = "cpu";
  std::map<std::string, Profiler> by_device;
};

// The CPU backend only.
ProfileBackends CpuProfileBackends();

int RunProfileCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                      const ProfileBackends& backends = CpuProfileBackends());

}  // namespace dynapipe::cli
