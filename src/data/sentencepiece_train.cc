// The trainer half of sentencepiece_shim.h, in its own library so that only
// tests link libsentencepiece_train.
#include <sentencepiece_trainer.h>

#include "src/data/sentencepiece_shim.h"

namespace dynapipe::data::spm {

bool Train(const std::string& flags, std::string* error) {
  const auto s = sentencepiece::SentencePieceTrainer::Train(flags);
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

}  // namespace dynapipe::data::spm
