#pragma once

// The synthetic dataset the worker tests train on: 96 samples of 8..71
// tokens (inputs 6..61, targets 2..11) over a 24-token alphabet, made once
// per test process under TEST_TMPDIR.

#include <string>

namespace dynapipe::runtime::executor::testing {

// The dataset's directory (`name` keeps tests' datasets apart).
std::string WorkerTestDataset(const std::string& name);

}  // namespace dynapipe::runtime::executor::testing
