#include "src/common/stats.h"

#include <catch2/catch.hpp>

namespace dynapipe {
namespace {

TEST_CASE("Median and percentile of unsorted samples") {
  CHECK(Median({}) == 0);
  CHECK(Median({3, 1, 2}) == 2);
  CHECK(Median({4, 1, 3, 2}) == 2.5);
  CHECK(Percentile({}, 0.9) == 0);
  CHECK(Percentile({5, 1, 4, 2, 3}, 0) == 1);
  CHECK(Percentile({5, 1, 4, 2, 3}, 1) == 5);
  CHECK(Percentile({5, 1, 4, 2, 3}, 0.9) == 5);  // rank 3.6 rounds to 4
  CHECK(Percentile({5, 1, 4, 2, 3}, 0.5) == 3);
}

}  // namespace
}  // namespace dynapipe
