#pragma once
// The logger troupe's components write to when their program gave them none.

#include <memory>

#include <kj/string.h>

namespace spdlog {
class logger;
}

namespace troupe {

// A new spdlog logger named `name` ("troupe" unless told) that writes to stderr, one line per
// event ("[2026-12-02 14:05:20.123] [troupe] [info] listening on tcp://..."), at the level
// TROUPE_LOG_LEVEL names: trace, debug, info (the default), warn, error, critical or off. An
// unknown level is reported once on the logger itself (warn) and info is used. Not registered
// in spdlog's global registry, so any number may exist; the caller owns it.
std::shared_ptr<spdlog::logger> newLogger(kj::StringPtr name = "troupe");

}  // namespace troupe
