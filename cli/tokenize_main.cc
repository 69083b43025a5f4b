// dynapipe-tokenize: SentencePiece in a process of its own. Debian's
// libsentencepiece carries its own protobuf-lite (3.14) and exports it,
// which cannot share a process with the libprotobuf (3.21) everything else
// links: whichever loads first breaks the other. So `dynapipe data import
// --tokenizer` runs this helper and talks to it over its stdin and stdout
// (src/data/tokenizer.h); it links SentencePiece and nothing of protobuf.
//
//   dynapipe-tokenize MODEL          serve requests (the protocol below)
//   dynapipe-tokenize --train FLAGS  train a model (SentencePiece's trainer flags; tests)
//
// Protocol, little-endian. On start: "DPTOK1", u32 vocabulary size, i32
// end-of-sequence id (-1: none); or "DPTOKE", u32 n, n bytes of error, and
// exit 2. Then per request: u32 n, n bytes of UTF-8 text (n = 0xffffffff:
// quit). Reply: u32 0, u32 count, count u32 ids; or u32 1, u32 n, n bytes of
// error.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "src/data/sentencepiece_shim.h"

namespace {

bool WriteAll(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(1, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(0, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteU32(uint32_t v) { return WriteAll(&v, 4); }

bool WriteError(const std::string& e) { return WriteU32(static_cast<uint32_t>(e.size())) && WriteAll(e.data(), e.size()); }

constexpr uint32_t kQuit = 0xffffffffu;
constexpr uint32_t kMaxText = 64u << 20;  // one request's text

}  // namespace

int main(int argc, char** argv) {
  using namespace dynapipe::data;
  if (argc == 3 && std::string(argv[1]) == "--train") {
    std::string error;
    if (spm::Train(argv[2], &error)) return 0;
    std::fprintf(stderr, "dynapipe-tokenize --train: %s\n", error.c_str());
    return 1;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: dynapipe-tokenize MODEL | --train FLAGS  (run by `dynapipe data import --tokenizer`)\n");
    return 2;
  }
  std::string error;
  spm::ModelPtr model = spm::Load(argv[1], &error);
  if (model == nullptr) {
    WriteAll("DPTOKE", 6);
    WriteError(error);
    return 2;
  }
  const uint32_t vocab = static_cast<uint32_t>(spm::PieceSize(*model));
  const int32_t eos = spm::EosId(*model);
  if (!WriteAll("DPTOK1", 6) || !WriteU32(vocab) || !WriteAll(&eos, 4)) return 1;
  std::string text;
  std::vector<int> ids;
  for (uint32_t n; ReadAll(&n, 4) && n != kQuit;) {
    if (n > kMaxText) {
      WriteU32(1);
      WriteError("text of " + std::to_string(n) + " bytes is over the limit");
      return 1;  // the stream cannot be resynchronised
    }
    text.resize(n);
    if (!ReadAll(text.data(), n)) return 1;
    ids.clear();
    if (!spm::Encode(*model, text, &ids, &error)) {
      if (!WriteU32(1) || !WriteError(error)) return 1;
      continue;
    }
    if (!WriteU32(0) || !WriteU32(static_cast<uint32_t>(ids.size()))) return 1;
    std::vector<uint32_t> out(ids.begin(), ids.end());
    if (!WriteAll(out.data(), out.size() * 4)) return 1;
  }
  return 0;
}
