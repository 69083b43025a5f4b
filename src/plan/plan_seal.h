#pragma once

// What makes a stored execution plan trustworthy, shared by the planner that
// seals it, the store that checks it on read and the executor that runs it:
// the format version, the checksum over its bytes, and the bounds an executor
// checks before allocating for it.

#include <cstdint>

#include "proto/plan.pb.h"

namespace dynapipe::plan {

// The plan format executors read (ExecutionPlan.schema_version); a plan of
// another version is refused, not misread.
inline constexpr uint32_t kPlanSchemaVersion = 1;

// Buffer slots a plan may declare: far above any real plan (a few per
// micro-batch in flight), low enough that checking one stays cheap.
inline constexpr int kMaxBufferSlots = 1 << 20;

// Checksum over the plan's serialized bytes with the checksum field cleared.
uint64_t PlanChecksum(const proto::ExecutionPlan& plan);
// Sets plan->checksum.
void SealPlan(proto::ExecutionPlan* plan);

}  // namespace dynapipe::plan
