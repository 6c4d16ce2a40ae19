// A program embedding a LocalLauncher, for the tests of what happens when the launcher's own
// process is signalled (tests/jobs/local_launcher_process_test.cpp).
//
//   troupe_test_launcher binary LOG_DIR REPLICA_PROGRAM   replicas run `REPLICA_PROGRAM wait`
//   troupe_test_launcher function LOG_DIR                 replicas run this program's "wait"
//                                                         function
//
// Submits a job "held" of two replicas, prints "PIDS <pid> <pid>" once both run, then waits for
// SIGTERM or SIGINT, shuts the launcher down (grace 5 s), prints "SHUTDOWN <phase>" and exits 0.
// With TROUPE_TEST_DEFAULT_SIGNALS=1 in its environment it leaves the signals to the launcher
// (LocalLauncherOptions::stopJobsOnSignal) and just runs its loop.

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include <kj/debug.h>

#include "troupe/base/event_loop.h"
#include "troupe/jobs/local_launcher.h"

namespace {

bool allStarted(const troupe::JobHandle& job) {
  for (auto& r : job.replicas()) {
    if (r.pid == 0) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::Entrypoints entrypoints;
  entrypoints.add("wait", [](troupe::EventLoop&, std::vector<std::string>) -> int {
    for (;;) pause();
  });
  KJ_IF_MAYBE(status, entrypoints.runIfReplica()) {
    return *status;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s binary LOG_DIR REPLICA_PROGRAM | function LOG_DIR\n", argv[0]);
    return 2;
  }
  std::string mode = argv[1];
  troupe::Entrypoint entrypoint;
  if (mode == "binary" && argc == 4) {
    entrypoint = troupe::Entrypoint::binary(argv[3], {"wait"});
  } else if (mode == "function" && argc == 3) {
    entrypoint = troupe::Entrypoint::function("wait");
  } else {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }

  const char* defaults = getenv("TROUPE_TEST_DEFAULT_SIGNALS");
  bool launcherHandlesSignals = defaults != nullptr && std::string(defaults) == "1";
  troupe::EventLoop loop;
  troupe::LocalLauncher launcher(loop, {.logDirectory = argv[2],
                                        .cpus = 4,
                                        .ramBytes = 1 << 30,
                                        .stopJobsOnSignal = launcherHandlesSignals});
  // Installed before the pids are printed, so that a SIGTERM sent after reading them is ours.
  kj::Promise<int> signalled = launcherHandlesSignals ? kj::Promise<int>(kj::NEVER_DONE)
                                                      : loop.onSignal({SIGTERM, SIGINT});
  auto job = launcher.submit({.name = "held",
                              .entrypoint = entrypoint,
                              .resources = troupe::ResourceConfig::withCpu(1, "64m"),
                              .replicas = 2});
  while (!allStarted(job) && !troupe::isFinal(job.status())) {
    job.whenChanged().wait(loop.waitScope());
  }
  printf("PIDS");
  for (auto& r : job.replicas()) printf(" %d", r.pid);
  printf("\n");
  fflush(stdout);

  if (launcherHandlesSignals) {
    kj::NEVER_DONE.wait(loop.waitScope());
  }
  signalled.wait(loop.waitScope());
  launcher.drain(5 * kj::SECONDS).wait(loop.waitScope());
  printf("SHUTDOWN %s\n", troupe::toString(job.status()).cStr());
  fflush(stdout);
  return 0;
}
