#pragma once

// `dynapipe data synth | import | info`: make and inspect training datasets
// (format in src/data/dataset.h).

#include <iosfwd>
#include <string>
#include <vector>

namespace dynapipe::cli {

// `data synth` defaults.
inline constexpr int kSynthDefaultSeed = 1;
inline constexpr int kSynthDefaultAlphabet = 32;
inline constexpr int kSynthDefaultMaxInput = 2048;

int RunDataCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace dynapipe::cli
