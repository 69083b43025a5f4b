#pragma once

// The few SentencePiece calls dynapipe-tokenize makes, behind plain C++
// types: SentencePiece's header declares `absl::string_view` itself, which
// clashes with Abseil's, and its library may not share a process with
// libprotobuf (src/data/tokenizer.h), so only the helper links this.

#include <memory>
#include <string>
#include <vector>

namespace dynapipe::data::spm {

struct Model;
struct ModelDeleter {
  void operator()(Model* m) const;
};
using ModelPtr = std::unique_ptr<Model, ModelDeleter>;

// Null with `*error` set when `path` is not a SentencePiece model.
ModelPtr Load(const std::string& path, std::string* error);
// False with `*error` set on failure.
bool Encode(const Model& m, const std::string& text, std::vector<int>* ids, std::string* error);
int PieceSize(const Model& m);
int EosId(const Model& m);

// Trains a model (tests): SentencePiece's trainer flags, e.g.
// "--input=x.txt --model_prefix=m --vocab_size=64"; false with `*error`.
bool Train(const std::string& flags, std::string* error);

}  // namespace dynapipe::data::spm
