// Every shipped example config parses as the message its folder holds and
// passes basic sanity checks.
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>

#include "proto/cluster.pb.h"
#include "proto/cost_profile.pb.h"
#include "proto/job.pb.h"
#include "proto/model.pb.h"
#include "src/common/proto_io.h"

namespace dynapipe {
namespace {

namespace fs = std::filesystem;

void CheckModel(const proto::ModelSpec& m) {
  CHECK(m.kind() != proto::ModelKind::unspecified);
  CHECK(m.num_layers() > 0);
  CHECK(m.hidden() > 0);
  CHECK(m.heads() > 0);
  CHECK(m.hidden() % m.heads() == 0);
  CHECK(m.vocab() > 0);
}

TEST_CASE("Every example config parses as its folder's message") {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  const fs::path root = fs::path(srcdir) / "dynapipe" / "configs";
  int checked = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    const std::string folder = entry.path().parent_path().filename().string();
    INFO(path);
    if (folder == "models") {
      proto::ModelSpec m;
      REQUIRE(LoadProtoFile(path, &m).ok());
      CheckModel(m);
    } else if (folder == "clusters") {
      proto::ClusterSpec c;
      REQUIRE(LoadProtoFile(path, &c).ok());
      CHECK(c.devices_per_node() > 0);
      CHECK(c.device().memory_mb() > 0);
      CHECK(c.intra_node_bandwidth_gbps() > 0);
    } else if (folder == "jobs") {
      proto::JobSpec j;
      const absl::Status s = LoadProtoFile(path, &j);
      INFO(s.ToString());
      REQUIRE(s.ok());
      CheckModel(j.model());
      CHECK(j.iterations() > 0);
    } else if (folder == "profiles") {
      proto::CostProfile p;
      REQUIRE(LoadProtoFile(path, &p).ok());
      CHECK(p.layers_size() > 0);
    } else {
      continue;
    }
    ++checked;
  }
  CHECK(checked >= 8);
}

}  // namespace
}  // namespace dynapipe
