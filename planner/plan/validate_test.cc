// ValidatePlans on plans read back from storage: sizes and slot counts are
// untrusted, so they are checked before anything is sized or indexed by them
// (inputs found by fuzz/plan_fuzzer; each case crashed or overflowed before).
#include "planner/plan/validate.h"

#include <catch2/catch.hpp>
#include <vector>

#include "planner/plan/instructions.h"
#include "src/plan/plan_seal.h"

namespace dynapipe::planner {
namespace {

using Catch::Matchers::Contains;

// The smallest valid plan set: one rank running one micro-batch.
proto::ExecutionPlan OneRank() {
  proto::ExecutionPlan p;
  p.set_schema_version(plan::kPlanSchemaVersion);
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
  plan::SealPlan(&p);
  return p;
}

TEST_CASE("ValidatePlans refuses untrusted sizes instead of using them") {
  std::vector<proto::ExecutionPlan> plans = {OneRank()};
  REQUIRE(ValidatePlans(plans).ok());
  proto::ExecutionPlan& p = plans[0];

  SECTION("a negative slot count") {
    // Sized a std::vector with it: std::length_error, uncaught.
    p.set_num_buffer_slots(-1);
    plan::SealPlan(&p);
    CHECK_THAT(std::string(ValidatePlans(plans).message()), Contains("num_buffer_slots -1"));
  }
  SECTION("a slot count no plan needs") {
    // 2e9 slots allocated 2 GB before any instruction was read.
    p.set_num_buffer_slots(plan::kMaxBufferSlots + 1);
    plan::SealPlan(&p);
    CHECK(ValidatePlans(plans).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("pp x dp wrapping around to the number of plans") {
    // 9 x 954437177 = 2^33 + 1 wraps to 1 in 32 bits, which let the group
    // loop index by_rank[g * pp] far past its one entry.
    p.set_pp_size(9);
    p.set_dp_size(954437177);
    plan::SealPlan(&p);
    CHECK_THAT(std::string(ValidatePlans(plans).message()), Contains("1 plans for pp 9 x dp 954437177"));
  }
  SECTION("coordinates whose rank overflows") {
    // dp_rank * pp = 2^31: signed overflow (reported under --config=asan).
    p.set_pp_size(2);
    p.set_dp_rank(1 << 30);
    plan::SealPlan(&p);
    proto::ExecutionPlan second = OneRank();
    second.set_rank(1);
    second.set_pp_rank(1);
    second.set_pp_size(2);
    plan::SealPlan(&second);
    plans.push_back(second);
    CHECK_THAT(std::string(ValidatePlans(plans).message()), Contains("inconsistent pp/dp coordinates"));
  }
}

// Two pipeline stages, two micro-batches, written by hand: stage 0 sends
// both activations before it receives the first gradient; stage 1 sends
// that gradient before it posts the receive of the second activation, with
// another instruction between them (so they are separate NCCL groups when
// `separate` holds).
std::vector<proto::ExecutionPlan> TwoStages(bool separate) {
  std::vector<proto::ExecutionPlan> plans(2);
  for (int r = 0; r < 2; ++r) {
    proto::ExecutionPlan& p = plans[r];
    p.set_schema_version(plan::kPlanSchemaVersion);
    p.set_job_id("j");
    p.set_iteration(1);
    p.set_rank(r);
    p.set_pp_rank(r);
    p.set_pp_size(2);
    p.set_dp_size(1);
    p.set_num_buffer_slots(4);
    for (int m = 0; m < 2; ++m) {
      proto::MicroBatch* mb = p.add_micro_batches();
      mb->set_index(m);
      mb->set_rows(1);
      mb->set_seq_len(8);
      proto::PlacedSample* s = mb->add_samples();
      s->set_id(10 + m);
      s->set_input_len(8);
    }
  }
  auto comm = [](proto::CommOp* op, int peer, int buffer) {
    op->set_peer(peer);
    op->add_buffer_ids(buffer);
    proto::TensorShape* t = op->add_shapes();
    t->add_dims(1);
    t->add_dims(8);
    t->add_dims(16);
  };
  auto add = [](proto::ExecutionPlan& p, int mb) {
    proto::Instruction* ins = p.add_instructions();
    ins->set_micro_batch(mb);
    return ins;
  };
  proto::ExecutionPlan& a = plans[0];  // buffers: activations 0, 1; gradients 2, 3
  for (int m = 0; m < 2; ++m) {
    add(a, m)->mutable_load_input();
    add(a, m)->mutable_forward()->add_output_buffers(m);
    comm(add(a, m)->mutable_send_activation_start(), 1, m);
  }
  for (int m = 0; m < 2; ++m) {
    comm(add(a, m)->mutable_send_activation_finish(), 1, m);
    comm(add(a, m)->mutable_recv_grad_start(), 1, 2 + m);
    comm(add(a, m)->mutable_recv_grad_finish(), 1, 2 + m);
    add(a, m)->mutable_backward()->add_grad_input_buffers(2 + m);
    add(a, m)->mutable_free_buffer()->add_buffer_ids(m);
    a.mutable_instructions(a.instructions_size() - 1)->mutable_free_buffer()->add_buffer_ids(2 + m);
  }
  add(a, -1)->mutable_optimizer_step();
  proto::ExecutionPlan& b = plans[1];  // buffers: activations 0, 2; gradients 1, 3
  for (int m = 0; m < 2; ++m) {
    if (m == 1) comm(add(b, m)->mutable_recv_activation_start(), 0, 2);
    if (m == 0) comm(add(b, m)->mutable_recv_activation_start(), 0, 0);
    comm(add(b, m)->mutable_recv_activation_finish(), 0, 2 * m);
    add(b, m)->mutable_load_input();
    add(b, m)->mutable_forward()->add_input_buffers(2 * m);
    add(b, m)->mutable_backward()->add_grad_output_buffers(1 + 2 * m);
    comm(add(b, m)->mutable_send_grad_start(), 0, 1 + 2 * m);
    if (m == 0 && separate) add(b, -1)->mutable_free_buffer();  // no-op between the starts
    if (m == 0) continue;
  }
  // Rank 1's second activation receive was placed after its first gradient
  // send above; finish both sends and free everything.
  for (int m = 0; m < 2; ++m) {
    comm(add(b, m)->mutable_send_grad_finish(), 0, 1 + 2 * m);
    add(b, m)->mutable_free_buffer()->add_buffer_ids(2 * m);
    b.mutable_instructions(b.instructions_size() - 1)->mutable_free_buffer()->add_buffer_ids(1 + 2 * m);
  }
  add(b, -1)->mutable_optimizer_step();
  for (auto& p : plans) plan::SealPlan(&p);
  return plans;
}

TEST_CASE("The validator runs plans under NCCL's group order too: a Gloo-safe exchange can deadlock there") {
  // Stage 0's group {send act 1} waits for stage 1's receive of it, whose
  // group waits for {send grad 0} to complete, which waits for stage 0's
  // receive of it, whose group waits for {send act 1}.
  const absl::Status split = ValidatePlans(TwoStages(/*separate=*/true));
  INFO(split);
  CHECK_THAT(std::string(split.message()), Contains("plans deadlock under NCCL's group order"));
  // The same starts back to back form one group: NCCL launches them together.
  const absl::Status together = ValidatePlans(TwoStages(/*separate=*/false));
  INFO(together);
  CHECK(together.ok());
}

}  // namespace
}  // namespace dynapipe::planner
