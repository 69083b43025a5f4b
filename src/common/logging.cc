#include "src/common/logging.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace dynapipe {

absl::Status InitLogging(const LoggingOptions& options) {
  const auto level = spdlog::level::from_str(options.level);
  // from_str maps unknown names to "off"; only "off" itself may mean off.
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level: unknown value \"", options.level, "\" (trace|debug|info|warn|error|critical|off)"));
  }
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!options.file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file));
    } catch (const spdlog::spdlog_ex& e) {
      return absl::UnavailableError(absl::StrCat("log file ", options.file, ": ", e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(options.process_name, sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n[%P] %v");
  // Every INFO line (lifecycle, one per iteration) is written at once: a
  // daemon killed with SIGKILL keeps its last lines. DEBUG and TRACE lines
  // go out with the next INFO line or within a second.
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  spdlog::flush_every(std::chrono::seconds(1));
  return absl::OkStatus();
}

}  // namespace dynapipe
