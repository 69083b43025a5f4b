#pragma once

// `dynapipe data synth | import | info`: make and inspect training datasets
// (format in runtime/data/dataset.h).

#include <iosfwd>
#include <string>
#include <vector>

namespace dynapipe::cli {

int RunDataCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace dynapipe::cli
