#pragma once
// troupe's logs in Python: what the module's loops log (its client loop, hosted actors, the
// launchers and registry they run) goes to Python's logging, logger "troupe", rather than
// straight to stderr. Records are queued by whatever thread logs and handed to Python under the
// GIL soon after (withGilSoon(), runtime.h), with the time they were made.

#include <memory>

#include <pybind11/pybind11.h>

namespace spdlog {
class logger;
}

namespace troupe::python {

// The logger the module's EventLoops log to (EventLoopOptions::logger): one per process, at the
// level TROUPE_LOG_LEVEL names (default info). Any thread.
std::shared_ptr<spdlog::logger> pythonLogger();

// Registers _troupe.set_log_handler(fn), which takes fn(records) to deliver the records to
// (a list of (levelno, created, message) tuples: Python's level numbers, seconds since the
// epoch), _troupe.flush_logs() and _troupe.close_logs() (at exit: later records go to stderr).
void bindLogs(pybind11::module_& m);

}  // namespace troupe::python
