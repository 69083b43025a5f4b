#pragma once

// Malformed job specs, generated from one valid job: every numeric field set
// outside its legal range (src/spec/job_spec.h), illegal combinations of
// fields, and hostile strings. Paths are in data_root.h (they need files).

#include <string>
#include <vector>

#include "proto/job.pb.h"

namespace dynapipe::testing::hostile {

struct SpecCase {
  std::string name;  // what the table calls it: "model.hidden = -1"
  proto::JobSpec spec;
};

// The valid job every case starts from: a small GPT on the lengths file
// `lengths` (a path the planner resolves under its --data_root).
proto::JobSpec BaseJob(const std::string& lengths);

// Every numeric field of JobSpec and of the messages inside it, found by
// reflection (a field added later is covered without editing this file), set
// to values no field accepts: int32 -1 / INT32_MIN / INT32_MAX, int64 -1 /
// INT64_MIN / INT64_MAX / 2^40, double -1 / NaN / +inf / -inf / 1e308, enums
// 99 / -3. Exempt: uint64 (the seed: any value is legal) and bools.
std::vector<SpecCase> NumericMutations(const proto::JobSpec& base);

// Values illegal only for one field or in combination (beta1 = 1, heads not
// dividing hidden, max_seq_len over max_positions, layer_to_device out of
// range, a world over the limit, checkpoint flags without a dir, ...).
std::vector<SpecCase> FieldMutations(const proto::JobSpec& base);

// Names: 257 bytes, 1 MB, control characters, NUL, invalid UTF-8.
std::vector<SpecCase> StringMutations(const proto::JobSpec& base);

// Valid specs at the edges (0 = "the default", the largest seed, ...): they
// must be accepted.
std::vector<SpecCase> ValidControls(const proto::JobSpec& base);

}  // namespace dynapipe::testing::hostile
