#include "src/plan/plan_seal.h"

#include <cstring>
#include <string>

namespace dynapipe::plan {
namespace {

// 64-bit multiply-xorshift hash over 8-byte words: stable across processes
// and builds (unlike absl::Hash) and several times faster than byte-wise FNV.
uint64_t HashBytes(const std::string& bytes, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes.data() + i, n - i);
  h = (h ^ tail ^ (static_cast<uint64_t>(n - i) << 56)) * 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 29);
}

// The checksum is field 31 (fixed64), serialized last: tag bytes 0xF9 0x01
// ((31 << 3) | 1 as a varint) then 8 little-endian bytes.
constexpr size_t kChecksumFieldBytes = 10;

}  // namespace

uint64_t PlanChecksum(const proto::ExecutionPlan& plan) {
  const std::string bytes = plan.SerializeAsString();
  if (plan.checksum() == 0) return HashBytes(bytes, bytes.size());
  // Hash everything before the trailing checksum field without copying the
  // message; fall back to a cleared copy if the layout is unexpected (e.g.
  // unknown fields from a newer schema follow it).
  const size_t n = bytes.size();
  if (n >= kChecksumFieldBytes && static_cast<unsigned char>(bytes[n - 10]) == 0xF9 &&
      static_cast<unsigned char>(bytes[n - 9]) == 0x01) {
    uint64_t stored;
    std::memcpy(&stored, bytes.data() + n - 8, 8);
    if (stored == plan.checksum()) return HashBytes(bytes, n - kChecksumFieldBytes);
  }
  proto::ExecutionPlan copy = plan;
  copy.clear_checksum();
  const std::string cleared = copy.SerializeAsString();
  return HashBytes(cleared, cleared.size());
}

void SealPlan(proto::ExecutionPlan* plan) {
  plan->clear_checksum();
  plan->set_checksum(PlanChecksum(*plan));
}

}  // namespace dynapipe::plan
