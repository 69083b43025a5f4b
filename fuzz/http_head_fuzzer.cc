// Fuzzes the status endpoint's request-head parser (src/http/request_head)
// the way StatusServer::Serve feeds it: the input arrives in pieces (split at
// its first byte), each prefix is checked with CheckPartialHead until the head
// ends, then ParseRequestHead parses it. What it accepts must respect the
// limits it promises, and a head refused while arriving is never accepted
// once complete.

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "src/http/request_head.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe::http;
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;  // the size of each read
  const absl::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  bool refused_early = false;
  for (size_t have = 0; have < input.size() && !refused_early;) {
    have = std::min(input.size(), have + piece);
    const absl::string_view buf = input.substr(0, have);
    if (FindHeadEnd(buf)) break;
    refused_early = CheckPartialHead(buf).status != 0;
  }
  const auto end = FindHeadEnd(input);
  if (!end) return 0;
  const HeadResult r = ParseRequestHead(input.substr(0, *end));
  if (r.head) {
    if (r.status != 0 || refused_early) std::abort();
    if (r.head->fields.size() > kMaxHeaderFields || r.head->target.size() > kMaxRequestTargetBytes ||
        r.head->method.size() > kMaxMethodBytes || *end > kMaxRequestHeadBytes) {
      std::abort();
    }
    if (r.head->target.compare(0, r.head->path.size(), r.head->path) != 0) std::abort();
  } else if (r.status < 400 || r.status > 505 || r.why.empty()) {
    std::abort();
  }
  return 0;
}
