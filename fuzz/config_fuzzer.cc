// Fuzzes the job-spec loader and the checks a spec meets on its way in. Each
// input is parsed both as text proto and as JSON (the two formats
// LoadProtoFile, spec::LoadJobSpec and `dynapipe submit` accept); every spec
// that parses goes through spec::NormalizeJobSpec (whose result must
// normalise to itself, as job_spec.h promises) and is printed as JSON
// (`dynapipe status --json`); a normalised spec then goes through
// BuildJobRuntime, what a planner runs on Submit (PlannerConfigFromJob, cost
// model, Planner::Create, dataset lengths, global batches) with the
// scratch directory as its data root. The dataset is pinned to a small
// lengths file there; the other paths (cost profile, checkpoint directory)
// stay fuzzed, so their confinement to the data root (ConfinedPath) is
// fuzzed too: they are only resolved and read, never written.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/scratch_dir.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/service/job_runtime.h"
#include "proto/job.pb.h"
#include "src/common/proto_io.h"
#include "src/spec/job_spec.h"

namespace dynapipe::fuzz {
namespace {

// A lengths file (relative to the scratch directory, the jobs' data root)
// every fuzzed job plans over: enough samples for a few global batches and
// data-parallel groups.
constexpr char kLengths[] = "lengths.txt";

void WriteLengths() {
  std::string text;
  for (int i = 0; i < 64; ++i) text += std::to_string(16 + (i * 37) % 200) + " " + std::to_string(1 + i % 24) + "\n";
  WriteScratchFile(ScratchDir() + "/" + kLengths, text);
}

void Check(const proto::JobSpec& parsed) {
  (void)ToJson(parsed);
  const auto normalized = spec::NormalizeJobSpec(parsed);
  if (!normalized.ok()) return;
  const auto again = spec::NormalizeJobSpec(*normalized);
  if (!again.ok() || !google::protobuf::util::MessageDifferencer::Equals(*again, *normalized)) {
    std::fprintf(stderr, "NormalizeJobSpec is not idempotent: %s\n",
                 again.ok() ? ToJson(*again).c_str() : std::string(again.status().message()).c_str());
    std::abort();
  }
  proto::JobSpec pinned = *normalized;
  pinned.mutable_dataset()->set_path(kLengths);
  pinned.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
  const auto entered = spec::NormalizedJobSpec::Normalize(pinned);  // where a submitted spec enters
  if (entered.ok()) (void)planner::service::BuildJobRuntime(*entered, "fuzz", ScratchDir());
}

}  // namespace
}  // namespace dynapipe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe;
  static const bool written = (fuzz::WriteLengths(), true);
  (void)written;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  {
    proto::JobSpec spec;
    if (ParseTextProto(text, "job.pbtxt", &spec).ok()) fuzz::Check(spec);
  }
  {
    proto::JobSpec spec;
    if (ParseJsonProto(text, "job.json", &spec).ok()) fuzz::Check(spec);
  }
  return 0;
}
