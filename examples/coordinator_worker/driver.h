#pragma once
// The coordinator demo's driver: starts the coordinator and the workers as jobs of a
// LocalLauncher, kills one worker and stalls another while they hold tasks, and checks that
// every task was done exactly once.

#include <cstdint>
#include <string>

#include <troupe/base/event_loop.h>

namespace coordinator {

struct DriverOptions {
  std::string resolver;      // where the jobs publish (an openResolver() URL); "" = the
                             // launcher's own registry
  uint32_t tasks = 200;      // tasks 0..tasks-1
  uint32_t workers = 4;      // worker replicas
  std::string logDirectory;  // replicas' logs; "" = the launcher's default
  kj::Duration lease = 500 * kj::MILLISECONDS;
  kj::Duration work = 20 * kj::MILLISECONDS;  // per task
};

// Runs the demo on `loop` (blocking) and returns the exit status: 0 when every check passed,
// 1 otherwise (having said why on stderr).
int runDriver(troupe::EventLoop& loop, const DriverOptions& options);

}  // namespace coordinator
