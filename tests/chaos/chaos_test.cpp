// The chaos test: four replicas of a job behind a pool, under a steady load of idempotent and
// non-idempotent calls, while a seeded driver SIGKILLs replicas, freezes them (SIGSTOP, then
// SIGCONT) and restarts the registry (SIGTERM or SIGKILL). Real processes throughout: the
// troupe-registry daemon, a LocalLauncher starting chaos_replica, a group and a pool.
//
// At the end it checks the rules in chaos_verdict.h for every call, that no troupe process
// ended in any way but the test's SIGKILL or a clean exit at the end, and that the job
// recovers, and prints what happened (seed, calls by kind and outcome, kills, freezes,
// registry restarts). A failing run prints the chaos history and the launcher's last lines;
// `--seed N` (or TROUPE_CHAOS_SEED) replays its schedule. `--minutes N` (TROUPE_CHAOS_MINUTES)
// makes it a soak; see bench/README.md.

#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/jobs/local_launcher.h"
#include "troupe/pool/actor_pool.h"
#include "tests/chaos/call_load.h"
#include "tests/chaos/chaos_driver.h"
#include "tests/chaos/chaos_settings.h"
#include "tests/chaos/chaos_verdict.h"
#include "tests/chaos/launcher_log.h"
#include "tests/chaos/ledger.h"
#include "tests/chaos/readiness_log.h"
#include "tests/chaos/registry_daemon.h"
#include "tests/support/launcher_helpers.h"
#include "tests/support/registry_helpers.h"

namespace troupe::chaos {
namespace {

constexpr uint32_t REPLICAS = 4;

// How far past its deadline a call may settle: time for the loop to get round to the deadline's
// timer on a busy machine. A hang is what this catches, not slowness.
constexpr kj::Duration MARGIN = 1 * kj::SECONDS;

// How long the job has to come back whole once the chaos stops: a frozen replica whose lease
// ran out registers again, a killed one restarts, and the registry has every entry again.
constexpr kj::Duration RECOVERY = 30 * kj::SECONDS;

void report(const std::string& line) {
  printf("[chaos] %s\n", line.c_str());
  fflush(stdout);
}

// Whether a replica's end, as the launcher reported it, is one the test allows: our own
// SIGKILL, or a clean exit once the job is being stopped.
bool allowedExit(const ReplicaExit& exit, const ChaosDriver& driver) {
  if (exit.how == "was killed by signal 9 (SIGKILL)") return driver.killed(exit.pid);
  return exit.duringShutdown && exit.how == "exited with status 0";
}

std::string describeWaitStatus(int status) {
  if (status == -1) return "did not exit in time";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

// Everything of one run but the load and the chaos, in the order it is built; torn down in
// reverse, also when an assertion fails: the launcher kills what is left of its replicas, the
// registry's process is killed, the directory of logs and ledgers goes.
struct ChaosRun {
  explicit ChaosRun(const ChaosSettings& settings)
      : loop(EventLoopOptions{.randomSeed = settings.seed}),
        // Separate streams, so that the schedule of one seed does not depend on how many calls
        // the load happened to make.
        driverRandom(settings.seed),
        loadRandom(settings.seed ^ 0x9e3779b97f4a7c15u),
        registry(loop),
        launcherLog(std::make_shared<LauncherLog>("chaos")),
        launcher(loop, {.resolver = registry.url(),
                        .logDirectory = dir.path + "/logs",
                        .logger = loggerFor(launcherLog)}),
        group(startJob()) {}

  JobGroup<Chaos> startJob() {
    ledgerDir = dir.path + "/ledger";
    KJ_REQUIRE(::mkdir(ledgerDir.c_str(), 0700) == 0, "mkdir", ledgerDir);
    JobRequest request{.name = "chaos",
                       .entrypoint = Entrypoint::binary(TROUPE_CHAOS_REPLICA_PATH),
                       .environment = {{LEDGER_DIR_VARIABLE, ledgerDir},
                                       {"TROUPE_CHAOS_PARENT_PID", std::to_string(getpid())}},
                       .replicas = REPLICAS,
                       // Every kill is a failure to the launcher; the job must outlive them all.
                       .maxRetriesFailure = 1000000};
    return createActorGroup<Chaos>(launcher, kj::mv(request), "chaos");
  }

  EventLoop loop;
  Random driverRandom;
  Random loadRandom;
  test::TempDir dir;
  std::string ledgerDir;
  RegistryDaemon registry;
  std::shared_ptr<LauncherLog> launcherLog;
  LocalLauncher launcher;
  JobGroup<Chaos> group;
};

// Once the chaos stopped and the driver thawed what it froze: the job comes back whole, and
// calls succeed again.
void expectRecovery(ChaosRun& run, ActorPool<Chaos>& pool) {
  auto& loop = run.loop;
  auto failed = kj::runCatchingExceptions([&]() {
    test::await(loop, run.group->waitReady(REPLICAS, RECOVERY).ignoreResult(), RECOVERY * 2);
    for (int i = 0; i < 8; ++i) {
      test::await(loop, pool.call([](Chaos::Client c) { return c.idempotentOpRequest().send(); },
                                  {.deadline = 5 * kj::SECONDS, .idempotent = true})
                            .ignoreResult());
    }
  });
  KJ_IF_MAYBE(e, failed) {
    ADD_FAILURE() << "the job did not recover after the chaos: " << e->getDescription().cStr();
  }
}

// Stops the job (every replica drains and exits 0) and then the registry (exit 0 on SIGTERM).
// Only then are the ledgers complete: a replica thawed at the end may still run calls that were
// queued while it was stopped.
void stopEverything(ChaosRun& run, JobHandle& job, ActorPool<Chaos>& pool) {
  test::await(run.loop, pool.drain());
  run.launcherLog->markShutdown();
  test::await(run.loop, job.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED) << job.reason();
  int status = run.registry.stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the registry " << describeWaitStatus(status) << " on SIGTERM";
}

std::string describeChaos(const ChaosCounts& counts, size_t starts, uint64_t seed) {
  return std::to_string(counts.kills) + " kills, " + std::to_string(counts.freezes) + " freezes, " +
         std::to_string(counts.registryTerms + counts.registryKills) + " registry restarts (" +
         std::to_string(counts.registryTerms) + " after SIGTERM, " +
         std::to_string(counts.registryKills) + " after SIGKILL), " +
         std::to_string(counts.skipped) + " actions skipped; " + std::to_string(starts) +
         " replica starts; seed " + std::to_string(seed);
}

// Fails the test for every broken rule (the first few calls named) and every process that
// ended as it should not have.
void expectVerdict(const Verdict& verdict, ChaosRun& run, const ChaosDriver& driver) {
  constexpr size_t SHOWN = 20;
  for (size_t i = 0; i < verdict.violations.size() && i < SHOWN; ++i) {
    ADD_FAILURE() << verdict.violations[i];
  }
  EXPECT_EQ(verdict.violations.size(), 0u)
      << "calls broke the rules (the first " << SHOWN << " are above)";
  for (auto& problem : driver.problems()) ADD_FAILURE() << problem;
  for (auto& exit : run.launcherLog->exits()) {
    EXPECT_TRUE(allowedExit(exit, driver))
        << "replica " << exit.index << " (pid " << exit.pid << ") " << exit.how
        << (exit.duringShutdown ? " when the job was stopped" : " during the chaos");
  }
}

// For a failed run: what the driver did, and the last words of the launcher and the replicas.
void reportFailure(uint64_t seed, const ChaosDriver& driver, ChaosRun& run, JobHandle& job) {
  report("seed " + std::to_string(seed) + " failed; what the driver did:");
  for (auto& line : driver.history()) report("  " + line);
  report("the launcher's last lines:");
  for (auto& line : run.launcherLog->tail()) report("  " + line);
  report("the replicas' last lines:");
  for (auto& line : job.logs(20)) report("  " + line);
}

TEST(Chaos, CallsKeepTheirPromisesWhileReplicasDieAndFreezeAndTheRegistryRestarts) {
  auto settings = ChaosSettings::fromEnvironment();
  report("seed " + std::to_string(settings.seed) + " (replay: --seed " +
         std::to_string(settings.seed) + "), " + std::to_string(settings.chaosTime / kj::SECONDS) +
         " s of chaos");
  ChaosRun run(settings);
  auto& loop = run.loop;
  auto& job = run.group.job;
  test::await(loop, run.group->waitReady(REPLICAS, test::PATIENCE).ignoreResult());

  // Attempts are bounded by each call's deadline rather than by a count: the rules say what a
  // call may fail with before its deadline, and "gave up after 5 attempts" is none of that.
  ActorPool<Chaos> pool(*run.group, {.maxAttempts = 1000000});
  ReadinessLog readiness(*run.group);
  CallLoad load(loop, pool, run.loadRandom);
  ChaosDriver driver(loop, run.driverRandom, job, run.registry);
  kj::UnwindDetector unwind;
  KJ_DEFER(if (unwind.isUnwinding() || ::testing::Test::HasFailure()) {
    // Also while an exception unwinds, so the report must not throw.
    kj::runCatchingExceptions([&]() { reportFailure(settings.seed, driver, run, job); });
  });

  auto until = loop.timer().now() + settings.chaosTime;
  auto both = kj::heapArrayBuilder<kj::Promise<void>>(2);
  both.add(load.run(until));
  both.add(driver.run(until));
  auto limit = settings.chaosTime + load.options().deadline + load.options().hangLimit +
               test::PATIENCE;
  test::await(loop, kj::joinPromises(both.finish()), limit);

  expectRecovery(run, pool);
  stopEverything(run, job, pool);
  auto verdict = judge(load.records(), readLedgers(run.ledgerDir), readiness,
                       load.options().deadline, MARGIN);
  for (auto& line : verdict.counts) report(line);
  report(describeChaos(driver.counts(), run.launcherLog->starts(), settings.seed));
  expectVerdict(verdict, run, driver);
}

}  // namespace
}  // namespace troupe::chaos
