#include "runtime/model/batch.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

namespace dynapipe::runtime::model {
namespace {

std::unique_ptr<data::Dataset> OneSampleDataset() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/batch-" + std::to_string(::getpid());
  proto::DatasetInfo info;
  info.set_vocab(16);
  info.add_tasks("t");
  auto w = data::DatasetWriter::Create(dir, info);
  REQUIRE(w.ok());
  const std::vector<uint32_t> in = {1, 2, 3}, out = {4};
  REQUIRE((*w)->Add(in, out, 0).ok());
  REQUIRE((*w)->Finish().ok());
  auto d = data::Dataset::Open(dir);
  REQUIRE(d.ok());
  return std::move(*d);
}

TEST_CASE("BuildTokenBatch refuses shapes a corrupt plan could ask for, before allocating") {
  const auto ds = OneSampleDataset();
  proto::MicroBatch mb;
  auto* s = mb.add_samples();
  s->set_id(0);
  s->set_row(0);
  s->set_offset(0);
  s->set_input_len(4);
  s->set_target_len(1);
  mb.set_rows(1);
  mb.set_seq_len(8);
  REQUIRE(BuildTokenBatch(mb, *ds, 64).ok());
  for (auto [rows, seq] : {std::pair{2147483647, 8}, {1, 128}, {1 << 21, 64}, {0, 8}, {-1, 8}}) {
    INFO(rows << "x" << seq);
    mb.set_rows(rows);
    mb.set_seq_len(seq);
    const auto b = BuildTokenBatch(mb, *ds, 64);
    CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace dynapipe::runtime::model
