// Fuzzes the safetensors reader (src/safetensors): each input is parsed in
// memory and, written to the scratch directory, opened from disk; both must
// agree on whether it is a valid file and on its tensors, and every
// floating-point tensor of a valid one is read back. Seeds are files written
// by the project's writer, and near-valid ones.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/scratch_dir.h"
#include "src/safetensors/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynapipe;
  static const std::string path = fuzz::ScratchDir() + "/model.safetensors";
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto mem = safetensors::Reader::FromBytes(bytes);
  fuzz::WriteScratchFile(path, bytes);
  const auto disk = safetensors::Reader::Open(path);
  if (mem.ok() != disk.ok()) std::abort();  // the two paths disagree: a bug
  if (!mem.ok()) return 0;
  if (mem->tensors().size() != disk->tensors().size()) std::abort();
  for (const safetensors::TensorInfo& t : mem->tensors()) {
    const auto a = mem->ReadF32(t.name);
    const auto b = disk->ReadF32(t.name);
    if (a.ok() != b.ok()) std::abort();
    // Bit for bit (NaN payloads included).
    if (a.ok() && (a->size() != b->size() || std::memcmp(a->data(), b->data(), a->size() * sizeof(float)) != 0)) {
      std::abort();
    }
  }
  return 0;
}
