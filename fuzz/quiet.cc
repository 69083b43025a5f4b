// Linked into every harness (alwayslink): silences libprotobuf's log, which
// reports every invalid UTF-8 string a parser meets (thousands a second under
// fuzzing, and slower than the parse itself), and spdlog below errors.
// Parse failures still reach the harness as statuses; FATAL still aborts.

#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  spdlog::set_level(spdlog::level::err);
  return 0;
}
