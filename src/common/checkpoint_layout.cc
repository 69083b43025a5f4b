#include "src/common/checkpoint_layout.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "src/common/status_macros.h"

namespace dynapipe::checkpoint_layout {
namespace {

absl::Status ListError(const std::error_code& ec, const std::filesystem::path& path) {
  const std::string message = absl::StrCat("list ", path.string(), ": ", ec.message());
  if (ec == std::errc::permission_denied || ec == std::errc::operation_not_permitted) {
    return absl::PermissionDeniedError(message);
  }
  // A path that cannot name a directory here: retrying will not help (as ErrnoStatus in file_util.cc).
  if (ec == std::errc::not_a_directory || ec == std::errc::filename_too_long ||
      ec == std::errc::too_many_symbolic_link_levels) {
    return absl::InvalidArgumentError(message);
  }
  return absl::UnavailableError(message);
}

// "iter-00000012" -> 12: digits only, as ShardPath writes them.
bool ParseNumbered(absl::string_view name, absl::string_view prefix, absl::string_view suffix, int64_t* out) {
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, suffix)) return false;
  if (name.empty() || name.size() > 18) return false;
  for (char c : name) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(name, out);
}

}  // namespace

std::string ShardPath(absl::string_view dir, int64_t iteration, int rank) {
  return absl::StrFormat("%s/iter-%08d/rank-%05d.ckpt", dir, iteration, rank);
}

absl::StatusOr<ShardMap> ShardsOnDisk(absl::string_view dir) {
  const std::filesystem::path root(std::string{dir});
  std::error_code ec;
  ShardMap out;
  std::vector<std::pair<int64_t, std::filesystem::path>> iterations;
  std::filesystem::directory_iterator it(root, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    int64_t iteration;
    std::error_code gone;  // an entry removed while listing is simply not there
    if (ParseNumbered(it->path().filename().string(), "iter-", "", &iteration) && it->is_directory(gone)) {
      iterations.emplace_back(iteration, it->path());
    }
  }
  if (ec) return ListError(ec, root);
  for (const auto& [iteration, path] : iterations) {
    std::set<int> ranks;
    std::filesystem::directory_iterator files(path, ec);
    for (; !ec && files != std::filesystem::directory_iterator(); files.increment(ec)) {
      int64_t rank;
      std::error_code gone;
      if (ParseNumbered(files->path().filename().string(), "rank-", ".ckpt", &rank) &&
          rank <= std::numeric_limits<int>::max() && files->is_regular_file(gone)) {
        ranks.insert(static_cast<int>(rank));
      }
    }
    if (ec == std::errc::no_such_file_or_directory) continue;  // removed while listing
    if (ec) return ListError(ec, path);
    if (!ranks.empty()) out[iteration] = std::move(ranks);
  }
  return out;
}

int64_t LatestComplete(const ShardMap& shards, int world) {
  for (auto it = shards.rbegin(); it != shards.rend(); ++it) {
    const std::set<int>& ranks = it->second;
    // Ranks 0..world-1 all there (ranks are non-negative and sorted).
    if (static_cast<int>(ranks.size()) >= world && *std::next(ranks.begin(), world - 1) == world - 1) {
      return it->first;
    }
  }
  return -1;
}

absl::StatusOr<int64_t> LatestCompleteOnDisk(absl::string_view dir, int world) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world: ", world, " must be positive"));
  ASSIGN_OR_RETURN(const ShardMap shards, ShardsOnDisk(dir));
  return LatestComplete(shards, world);
}

}  // namespace dynapipe::checkpoint_layout
