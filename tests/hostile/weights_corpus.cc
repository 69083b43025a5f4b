#include "tests/hostile/weights_corpus.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"
#include "src/safetensors/safetensors.h"

namespace dynapipe::testing::hostile {

namespace {

namespace fs = std::filesystem;

// The 8-byte little-endian length, then `header`, then `data_bytes` zeros.
std::string Raw(const std::string& header, size_t data_bytes, uint64_t claimed = 0) {
  std::string out(8, '\0');
  uint64_t n = claimed != 0 ? claimed : header.size();
  for (int k = 0; k < 8; ++k, n >>= 8) out[k] = static_cast<char>(n & 0xFF);
  return out + header + std::string(data_bytes, '\0');
}

std::string Tensor(const std::string& name, const std::string& dtype, const std::string& shape, int64_t b, int64_t e) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape, ",\"data_offsets\":[", b, ",",
                      e, "]}");
}

}  // namespace

absl::StatusOr<WeightsCorpus> MakeWeightsCorpus(const std::string& root) {
  WeightsCorpus c;
  const std::string base = root + "/weights";
  fs::create_directories(base + "/valid");
  const std::vector<float> w(24, 0.5f);
  ASSIGN_OR_RETURN(const std::string valid,
                   safetensors::Serialize(std::vector<safetensors::TensorOut>{
                       safetensors::F32Tensor("transformer.wte.weight", {4, 6}, w)}, {{"format", "pt"}}));
  RETURN_IF_ERROR(WriteFileAtomic(base + "/valid/model.safetensors", valid));
  RETURN_IF_ERROR(WriteFileAtomic(base + "/valid/config.json", R"({"model_type": "gpt2", "n_head": 4})"));
  c.valid = "weights/valid";

  int n = 0;
  // A file of `bytes` under its own folder, named as the case's path.
  auto file = [&](const std::string& name, const std::string& bytes) -> absl::Status {
    const std::string rel = absl::StrCat("weights/f", n++, ".safetensors");
    RETURN_IF_ERROR(WriteFileAtomic(root + "/" + rel, bytes));
    c.bad.push_back({name, rel});
    return absl::OkStatus();
  };
  // A folder with `files` (name -> bytes; "" for a FIFO).
  auto folder = [&](const std::string& name, const std::vector<std::pair<std::string, std::string>>& files) -> absl::Status {
    const std::string rel = absl::StrCat("weights/d", n++);
    fs::create_directories(root + "/" + rel);
    for (const auto& [f, bytes] : files) {
      const std::string p = root + "/" + rel + "/" + f;
      if (bytes.empty()) {
        if (::mkfifo(p.c_str(), 0600) != 0) return absl::InternalError("mkfifo " + p);
      } else {
        RETURN_IF_ERROR(WriteFileAtomic(p, bytes));
      }
    }
    c.bad.push_back({name, rel});
    return absl::OkStatus();
  };
  const std::string ok = Tensor("a", "F32", "[2]", 0, 8);
  RETURN_IF_ERROR(file("empty file", std::string()));
  RETURN_IF_ERROR(file("5 bytes", "\x10\0\0\0\0"));
  RETURN_IF_ERROR(file("header length past the file", Raw("{" + ok + "}", 8, 4096)));
  RETURN_IF_ERROR(file("header length 2^40 (above the 100 MB limit)", Raw("{" + ok + "}", 8, uint64_t{1} << 40)));
  RETURN_IF_ERROR(file("header length 2^64-1", Raw("{" + ok + "}", 8, UINT64_MAX)));
  RETURN_IF_ERROR(file("header not JSON", Raw("this is not json", 0)));
  RETURN_IF_ERROR(file("header a JSON array", Raw("[1,2]", 0)));
  RETURN_IF_ERROR(file("JSON nested 100000 deep", Raw(std::string(100000, '[') + std::string(100000, ']'), 0)));
  RETURN_IF_ERROR(file("data truncated by 4 bytes", Raw("{" + ok + "}", 4)));
  RETURN_IF_ERROR(file("4 bytes of data past every tensor", Raw("{" + ok + "}", 12)));
  RETURN_IF_ERROR(file("offsets past the data", Raw("{" + Tensor("a", "F32", "[2]", 8, 16) + "}", 8)));
  RETURN_IF_ERROR(file("offsets reversed", Raw("{" + Tensor("a", "F32", "[0]", 8, 0) + "}", 8)));
  RETURN_IF_ERROR(file("overlapping tensors",
                       Raw("{" + ok + "," + Tensor("b", "F32", "[1]", 4, 8) + "}", 8)));
  RETURN_IF_ERROR(file("a hole between tensors",
                       Raw("{" + Tensor("a", "F32", "[1]", 0, 4) + "," + Tensor("b", "F32", "[1]", 8, 12) + "}", 12)));
  RETURN_IF_ERROR(file("unknown dtype F31", Raw("{" + Tensor("a", "F31", "[2]", 0, 8) + "}", 8)));
  RETURN_IF_ERROR(file("shape and bytes disagree", Raw("{" + Tensor("a", "F32", "[3]", 0, 8) + "}", 8)));
  RETURN_IF_ERROR(file("shape of 2^62 x 2^62 elements",
                       Raw("{" + Tensor("a", "F32", "[4611686018427387904,4611686018427387904]", 0, 8) + "}", 8)));
  RETURN_IF_ERROR(file("negative dimension", Raw("{" + Tensor("a", "F32", "[-2]", 0, 8) + "}", 8)));
  RETURN_IF_ERROR(file("a tensor named twice", Raw("{" + ok + "," + ok + "}", 8)));
  RETURN_IF_ERROR(file("__metadata__ holding a number", Raw(R"({"__metadata__":{"format":7}})", 0)));
  RETURN_IF_ERROR(file("a lone surrogate in a name", Raw("{" + Tensor("\\ud800", "F32", "[2]", 0, 8) + "}", 8)));
  RETURN_IF_ERROR(folder("a folder with neither model.safetensors nor an index", {{"config.json", "{}"}}));
  RETURN_IF_ERROR(folder("model.safetensors is a FIFO", {{"model.safetensors", ""}}));
  RETURN_IF_ERROR(folder("config.json is a FIFO", {{"model.safetensors", valid}, {"config.json", ""}}));
  RETURN_IF_ERROR(folder("the index is a FIFO", {{"model.safetensors.index.json", ""}}));
  RETURN_IF_ERROR(folder("an index naming a file outside the folder",
                         {{"model.safetensors.index.json", R"({"weight_map":{"a":"../valid/model.safetensors"}})"}}));
  RETURN_IF_ERROR(folder("an index naming a tensor its file lacks",
                         {{"model.safetensors.index.json", R"({"weight_map":{"zzz":"m.safetensors"}})"},
                          {"m.safetensors", valid}}));
  RETURN_IF_ERROR(folder("one tensor in two shards",
                         {{"model.safetensors.index.json",
                           R"({"weight_map":{"transformer.wte.weight":"a.safetensors"}})"},
                          {"a.safetensors", valid}, {"b.safetensors", valid}}));
  // The second shard is listed too, so both are opened.
  c.bad.back().name = "one tensor in two shards";
  RETURN_IF_ERROR(WriteFileAtomic(root + "/" + c.bad.back().path + "/model.safetensors.index.json",
                                  R"({"weight_map":{"transformer.wte.weight":"a.safetensors","x":"b.safetensors"}})"));
  RETURN_IF_ERROR(folder("an index without a weight_map", {{"model.safetensors.index.json", R"({"metadata":{}})"}}));
  const std::string link = absl::StrCat("weights/zero", n++, ".safetensors");
  fs::create_symlink("/dev/zero", root + "/" + link);
  c.bad.push_back({"a link to /dev/zero", link});
  c.bad.push_back({"nonexistent file", "weights/none.safetensors"});
  return c;
}

}  // namespace dynapipe::testing::hostile
