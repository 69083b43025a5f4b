#include "src/store/plan_store.h"

#include <random>

#include "absl/strings/str_format.h"

namespace dynapipe::store {

std::string NewStoreId() {
  std::random_device device;
  return absl::StrFormat("%08x", static_cast<uint32_t>(device()));
}

}  // namespace dynapipe::store
