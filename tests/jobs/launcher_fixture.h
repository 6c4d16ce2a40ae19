#pragma once
// The fixture the LocalLauncher tests share: a loop, a temporary log directory, a launcher on a
// machine of known size (4 cpus, 8 GiB, no GPU unless a test says otherwise), and a logger the
// test can wait on.

#include <gtest/gtest.h>

#include "troupe/jobs/local_launcher.h"
#include "tests/support/launcher_helpers.h"
#include "tests/support/registry_helpers.h"

namespace troupe::test {

class LauncherTest : public ::testing::Test {
protected:
  // `loopOptions` for the test's loop (a manual clock, say).
  explicit LauncherTest(EventLoopOptions loopOptions = {})
      : loop(kj::mv(loopOptions)), sink(std::make_shared<LineSink>()) {}
  ~LauncherTest() noexcept override {}

  LocalLauncherOptions options() {
    return {.logDirectory = dir.path,
            .terminateGrace = 5 * kj::SECONDS,
            .cpus = 4,
            .ramBytes = uint64_t{8} << 30,
            .gpus = 0,
            .logger = loggerFor(sink)};
  }

  LocalLauncher& start(LocalLauncherOptions o) {
    launcher = nullptr;
    launcher = kj::heap<LocalLauncher>(loop, kj::mv(o));
    return *launcher;
  }
  LocalLauncher& start() { return start(options()); }

  // A job of `replicas` replicas, each needing `cpus` cores and 64 MiB.
  static JobRequest request(std::string name, Entrypoint entrypoint, uint32_t replicas = 1,
                            double cpus = 1) {
    return jobRequest(kj::mv(name), kj::mv(entrypoint), replicas, cpus);
  }

  // The replica program (tests/support/test_replica_main.cpp) running `args`.
  static Entrypoint replica(std::vector<std::string> args) {
    return Entrypoint::binary(TROUPE_TEST_REPLICA_PATH, kj::mv(args));
  }

  // The job's final phase, failing the test if it takes longer than PATIENCE.
  JobPhase finalPhase(JobHandle& job) { return await(loop, job.wait(PATIENCE)); }

  // Waits until every replica of `job` has a process.
  void awaitStarted(JobHandle& job) {
    for (;;) {
      bool all = true;
      for (auto& r : job.replicas()) all = all && r.pid != 0;
      if (all || isFinal(job.status())) return;
      await(loop, job.whenChanged());
    }
  }

  // Waits until `job` is in `phase` (or final).
  void awaitPhase(JobHandle& job, JobPhase phase) {
    while (job.status() != phase && !isFinal(job.status())) await(loop, job.whenChanged());
  }

  // Lines of the job's logs (all of them) that contain `text`.
  static std::vector<std::string> grep(const JobHandle& job, const std::string& text) {
    return grepLogs(job, text);
  }

  EventLoop loop;
  TempDir dir;
  std::shared_ptr<LineSink> sink;
  kj::Own<LocalLauncher> launcher;  // before the directory and the loop go
};

}  // namespace troupe::test
