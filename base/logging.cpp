#include "troupe/base/logging.h"

#include <cstdlib>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace troupe {

std::shared_ptr<spdlog::logger> newLogger(kj::StringPtr name) {
  auto logger = std::make_shared<spdlog::logger>(name.cStr(),
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  logger->set_level(spdlog::level::info);
  const char* text = getenv("TROUPE_LOG_LEVEL");
  if (text != nullptr && *text != '\0') {
    std::string wanted = text;
    auto level = spdlog::level::from_str(wanted);
    // from_str() answers "off" for anything it does not know; only "off" itself means off.
    if (level == spdlog::level::off && wanted != "off") {
      logger->warn("TROUPE_LOG_LEVEL '{}' is not one of trace, debug, info, warn, error, "
                   "critical, off; logging at info",
                   wanted.substr(0, 40));
    } else {
      logger->set_level(level);
    }
  }
  return logger;
}

}  // namespace troupe
