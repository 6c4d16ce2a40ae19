// A coordinator hands tasks to workers under leases; one worker is killed and another stalled
// while they hold tasks, and every task is still done exactly once.
//
//   coord_demo [--resolver URL] [--tasks T] [--workers W] [--log-dir DIR]
//
// Run without an entrypoint it is the driver (driver.h): it submits job "coord" (one replica
// of this program running the "coordinator" function) and job "workers" (W replicas running
// "worker") to a LocalLauncher publishing in the registry at URL (without one, a registry the
// launcher runs itself), and checks the outcome.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <troupe/base/parse_number.h>
#include <troupe/jobs/job_request.h>
#include <troupe/resolver/host_actor.h>
#include <troupe/resolver/open_resolver.h>

#include "coordinator_impl.h"
#include "driver.h"
#include "worker.h"

namespace {

// `text` as a whole number in [min, max].
std::optional<uint32_t> parseNumber(const std::string& text, uint32_t min, uint32_t max) {
  auto value = troupe::parseWholeNumber(kj::StringPtr(text.c_str()), max);
  if (value == nullptr || KJ_ASSERT_NONNULL(value) < min) return std::nullopt;
  return static_cast<uint32_t>(KJ_ASSERT_NONNULL(value));
}

// Reads "--flag value" pairs into `values`, which holds every known flag with its default.
// False for an unknown flag or one without a value.
bool parseFlags(const std::vector<std::string>& args, std::map<std::string, std::string>& values) {
  if (args.size() % 2 != 0) return false;
  for (size_t i = 0; i < args.size(); i += 2) {
    auto it = values.find(args[i]);
    if (it == values.end()) return false;
    it->second = args[i + 1];
  }
  return true;
}

// The "coordinator" entrypoint: hosts the Coordinator until SIGTERM.
int runCoordinator(troupe::EventLoop& loop, std::vector<std::string> args) {
  std::map<std::string, std::string> flags{{"--tasks", "200"}, {"--lease-ms", "500"}};
  std::optional<uint32_t> tasks, leaseMs;
  if (!parseFlags(args, flags) || !(tasks = parseNumber(flags["--tasks"], 1, 10000000)) ||
      !(leaseMs = parseNumber(flags["--lease-ms"], 10, 600000))) {
    fprintf(stderr, "usage: coordinator [--tasks N] [--lease-ms MS]\n");
    return 2;
  }
  return troupe::hostActor<coordinator::Coordinator>(
      loop, coordinator::COORDINATOR_ACTOR,
      kj::heap<coordinator::CoordinatorImpl>(
          loop.timer(),
          coordinator::CoordinatorOptions{.tasks = *tasks, .lease = *leaseMs * kj::MILLISECONDS}),
      {.actor = {.maxConcurrency = 0}});
}

// The "worker" entrypoint: takes tasks from the job's coordinator until none is left.
int runWorker(troupe::EventLoop& loop, std::vector<std::string> args) {
  std::map<std::string, std::string> flags{{"--work-ms", "20"}};
  std::optional<uint32_t> workMs;
  if (!parseFlags(args, flags) || !(workMs = parseNumber(flags["--work-ms"], 0, 60000))) {
    fprintf(stderr, "usage: worker [--work-ms MS]\n");
    return 2;
  }
  auto job = troupe::JobContext::fromEnvironment();
  if (job.resolver.empty()) {
    fprintf(stderr, "worker: TROUPE_RESOLVER is not set: no way to find the coordinator\n");
    return 2;
  }
  auto resolver = troupe::openResolver(loop, job.resolver.c_str());
  troupe::ActorGroup<coordinator::Coordinator> group(loop, *resolver, coordinator::COORDINATOR_JOB,
                                                     coordinator::COORDINATOR_ACTOR);
  group.waitReady(1, 30 * kj::SECONDS).wait(loop.waitScope());
  troupe::ActorPool<coordinator::Coordinator> pool(group);

  auto name = coordinator::workerName(job.jobId, job.taskIndex, getpid());
  coordinator::Worker worker(loop.timer(), pool,
                             {.name = name, .work = *workMs * kj::MILLISECONDS});
  worker.run().wait(loop.waitScope());
  printf("%s: %u results accepted, %u refused; no task left\n", name.c_str(), worker.accepted,
         worker.refused);
  return 0;
}

int usage(const char* program) {
  fprintf(stderr, "usage: %s [--resolver URL] [--tasks T] [--workers W] [--log-dir DIR]\n",
          program);
  fprintf(stderr, "  T: tasks, 50..1000000 (default 200); W: workers, 2..16 (default 4)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::Entrypoints entrypoints;
  entrypoints.add("coordinator", runCoordinator);
  entrypoints.add("worker", runWorker);
  KJ_IF_MAYBE(status, entrypoints.runIfReplica()) {
    return *status;
  }

  std::map<std::string, std::string> flags{
      {"--resolver", ""}, {"--tasks", "200"}, {"--workers", "4"}, {"--log-dir", ""}};
  if (!parseFlags(std::vector<std::string>(argv + 1, argv + argc), flags)) return usage(argv[0]);
  // At least 50 tasks, so that some are left when a worker is killed and another stalled; at
  // most 16 workers, so that their cpu shares fit a small machine.
  auto tasks = parseNumber(flags["--tasks"], 50, 1000000);
  auto workers = parseNumber(flags["--workers"], 2, 16);
  if (!tasks || !workers) return usage(argv[0]);

  // The launcher's own chatter stays out of the demo's output; replicas log at info.
  spdlog::set_level(spdlog::level::warn);
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  return coordinator::runDriver(loop, {.resolver = flags["--resolver"],
                                       .tasks = *tasks,
                                       .workers = *workers,
                                       .logDirectory = flags["--log-dir"]});
}
