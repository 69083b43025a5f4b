// ValidatePlans on plans read back from storage: sizes and slot counts are
// untrusted, so they are checked before anything is sized or indexed by them
// (inputs found by fuzz/plan_fuzzer; each case crashed or overflowed before).
#include "planner/plan/validate.h"

#include <catch2/catch.hpp>
#include <vector>

#include "planner/plan/instructions.h"

namespace dynapipe::planner {
namespace {

using Catch::Matchers::Contains;

// The smallest valid plan set: one rank running one micro-batch.
proto::ExecutionPlan OneRank() {
  proto::ExecutionPlan p;
  p.set_schema_version(kPlanSchemaVersion);
  p.set_job_id("j");
  p.set_iteration(3);
  p.set_pp_size(1);
  p.set_dp_size(1);
  p.set_num_buffer_slots(1);
  proto::MicroBatch* mb = p.add_micro_batches();
  mb->set_rows(1);
  mb->set_seq_len(8);
  mb->add_samples()->set_input_len(8);
  auto add = [&](int micro_batch) {
    proto::Instruction* ins = p.add_instructions();
    ins->set_micro_batch(micro_batch);
    return ins;
  };
  add(0)->mutable_load_input()->add_buffer_ids(0);
  add(0)->mutable_forward()->add_input_buffers(0);
  add(0)->mutable_backward();
  add(0)->mutable_free_buffer()->add_buffer_ids(0);
  add(-1)->mutable_optimizer_step();
  SealPlan(&p);
  return p;
}

TEST_CASE("ValidatePlans refuses untrusted sizes instead of using them") {
  std::vector<proto::ExecutionPlan> plans = {OneRank()};
  REQUIRE(ValidatePlans(plans).ok());
  proto::ExecutionPlan& p = plans[0];

  SECTION("a negative slot count") {
    // Sized a std::vector with it: std::length_error, uncaught.
    p.set_num_buffer_slots(-1);
    SealPlan(&p);
    CHECK_THAT(std::string(ValidatePlans(plans).message()), Contains("num_buffer_slots -1"));
  }
  SECTION("a slot count no plan needs") {
    // 2e9 slots allocated 2 GB before any instruction was read.
    p.set_num_buffer_slots(kMaxBufferSlots + 1);
    SealPlan(&p);
    CHECK(ValidatePlans(plans).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("pp x dp wrapping around to the number of plans") {
    // 9 x 954437177 = 2^33 + 1 wraps to 1 in 32 bits, which let the group
    // loop index by_rank[g * pp] far past its one entry.
    p.set_pp_size(9);
    p.set_dp_size(954437177);
    SealPlan(&p);
    CHECK_THAT(std::string(ValidatePlans(plans).message()), Contains("1 plans for pp 9 x dp 954437177"));
  }
  SECTION("coordinates whose rank overflows") {
    // dp_rank * pp = 2^31: signed overflow (reported under --config=asan).
    p.set_pp_size(2);
    p.set_dp_rank(1 << 30);
    SealPlan(&p);
    proto::ExecutionPlan second = OneRank();
    second.set_rank(1);
    second.set_pp_rank(1);
    second.set_pp_size(2);
    SealPlan(&second);
    plans.push_back(second);
    CHECK_THAT(std::string(ValidatePlans(plans).message()), Contains("inconsistent pp/dp coordinates"));
  }
}

}  // namespace
}  // namespace dynapipe::planner
