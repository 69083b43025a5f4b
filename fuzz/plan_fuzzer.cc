// Fuzzes plan decoding as executors and tools meet stored plans: each
// input is a PlanSet (fuzz/plan_set.proto) holding the stored bytes of one
// iteration's plans. Every entry goes through DecodePlan (parse + checksum,
// what PlanStore::GetPlan returns); the first through the executor's
// PlanPrefetcher (job, rank and iteration checks). Every entry that parses is
// then re-sealed, so that corrupt content rather than a stale checksum is
// what ValidatePlans (buffers, op order, co-simulated transfers, samples)
// sees for the whole set.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/plan_set.pb.h"
#include "planner/plan/validate.h"
#include "proto/plan.pb.h"
#include "runtime/executor/plan_prefetcher.h"
#include "src/plan/plan_seal.h"
#include "src/store/plan_store.h"

namespace {
// The job and iteration the seeds' plans belong to (fuzz/make_seeds.cc).
constexpr char kJob[] = "fuzz";
constexpr int64_t kIteration = 3;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe;
  fuzz::PlanSet set;
  if (!set.ParseFromArray(data, static_cast<int>(size))) return 0;
  std::vector<proto::ExecutionPlan> resealed;
  for (int i = 0; i < set.plans_size(); ++i) {
    (void)store::DecodePlan(set.plans(i), "plan " + std::to_string(i));
    proto::ExecutionPlan plan;
    if (!plan.ParseFromString(set.plans(i))) continue;
    plan::SealPlan(&plan);
    resealed.push_back(std::move(plan));
  }
  if (set.plans_size() > 0) {
    runtime::executor::PlanPrefetcher prefetcher(
        kJob, /*rank=*/0, [&](int64_t) { return store::DecodePlan(set.plans(0), "plan 0"); },
        /*end=*/kIteration + 1, /*depth=*/0, [] { return false; });
    (void)prefetcher.Next(kIteration);
  }
  (void)planner::ValidatePlans(resealed);
  return 0;
}
