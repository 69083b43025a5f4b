#include "runtime/comm/kv_store.h"

#include <catch2/catch.hpp>
#include <thread>

#include "absl/time/clock.h"

namespace dynapipe::runtime::comm {
namespace {

TEST_CASE("MemoryKeyValueStore returns what was set, the latest value winning") {
  MemoryKeyValueStore store;
  REQUIRE(store.Set("a", "1").ok());
  REQUIRE(store.Set("a", std::string("2\0x", 3)).ok());
  const absl::StatusOr<std::string> value = store.Get("a", absl::ZeroDuration());
  REQUIRE(value.ok());
  CHECK(*value == std::string("2\0x", 3));
}

TEST_CASE("MemoryKeyValueStore Get waits for a key set later") {
  MemoryKeyValueStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    REQUIRE(store.Set("late", "v").ok());
  });
  const absl::StatusOr<std::string> value = store.Get("late", absl::Seconds(10));
  setter.join();
  REQUIRE(value.ok());
  CHECK(*value == "v");
}

TEST_CASE("MemoryKeyValueStore Get gives up after its wait with DEADLINE_EXCEEDED naming the key") {
  MemoryKeyValueStore store;
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> value = store.Get("missing", absl::Milliseconds(100));
  const absl::Duration elapsed = absl::Now() - start;
  CHECK(absl::IsDeadlineExceeded(value.status()));
  CHECK(value.status().message().find("'missing'") != absl::string_view::npos);
  CHECK(elapsed >= absl::Milliseconds(100));
  CHECK(elapsed < absl::Seconds(2));
}

}  // namespace
}  // namespace dynapipe::runtime::comm
