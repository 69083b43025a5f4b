#pragma once

// The file-shaped part of the hostile-input corpus: job specs (every field),
// the paths a job names, spec files, lengths files, datasets, checkpoint
// shards and the CLI's flags, each fed to the planner under test (gRPC
// Submit, one attempt) and/or the `dynapipe` CLI and counted in a Tally
// under its input surface.

#include <string>

#include "proto/job.pb.h"
#include "tests/hostile/checkpoint_corpus.h"
#include "tests/hostile/data_root.h"
#include "tests/hostile/weights_corpus.h"
#include "tests/hostile/planner_under_test.h"
#include "tests/hostile/tally.h"

namespace dynapipe::testing::hostile {

// tests/hostile/corpus in the runfiles.
std::string CorpusDir();

// Valid controls, then every NumericMutations / FieldMutations /
// StringMutations case, over gRPC and through `dynapipe submit` (spec files
// written to `files`).
void FeedJobSpecs(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const std::string& files);
// Bad paths for dataset.path, checkpoint.dir and cost_profile_path, over gRPC
// and the CLI; devices, FIFOs and /proc files to `permissive` (--data_root=/).
void FeedJobPaths(PlannerUnderTest& p, PlannerUnderTest& permissive, Tally& t, const proto::JobSpec& base,
                  const DataRoot& root, const std::string& fifo, const std::string& files);
// corpus/specs/ and generated junk as `dynapipe submit FILE`.
void FeedSpecFiles(PlannerUnderTest& p, Tally& t, const std::string& scratch);
// Broken lengths files to Submit and to `dynapipe data synth --lengths`.
void FeedLengthsFiles(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const DataRoot& root,
                      const std::string& scratch);
// Corrupted datasets to Submit and to `dynapipe data info`.
void FeedDatasets(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const DataRoot& root);
// Hugging Face weight files as model.init_from to Submit.
void FeedWeights(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base, const WeightsCorpus& c);
// Corrupted shards to `dynapipe eval --checkpoint`.
void FeedCheckpoints(PlannerUnderTest& p, Tally& t, const CheckpointCorpus& c);
// Bad flags and arguments to the CLI's commands.
void FeedCliFlags(PlannerUnderTest& p, Tally& t, const std::string& scratch, const std::string& fifo,
                  const CheckpointCorpus& ckpt);

}  // namespace dynapipe::testing::hostile
