#include "src/data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace dynapipe::data::spm {

struct Model {
  sentencepiece::SentencePieceProcessor sp;
};

void ModelDeleter::operator()(Model* m) const { delete m; }

ModelPtr Load(const std::string& path, std::string* error) {
  ModelPtr m(new Model);
  const auto s = m->sp.Load(path);
  if (!s.ok()) {
    *error = s.ToString();
    return nullptr;
  }
  return m;
}

bool Encode(const Model& m, const std::string& text, std::vector<int>* ids, std::string* error) {
  const auto s = m.sp.Encode(text, ids);
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

int PieceSize(const Model& m) { return m.sp.GetPieceSize(); }
int EosId(const Model& m) { return m.sp.eos_id(); }

}  // namespace dynapipe::data::spm
