#include "driver.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include <map>
#include <vector>

#include <kj/debug.h>

#include <troupe/base/errors.h>
#include <troupe/jobs/local_launcher.h>
#include <troupe/pool/actor_pool.h>

#include "coordinator_impl.h"
#include "worker.h"

namespace coordinator {
namespace {

constexpr kj::StringPtr WORKERS_JOB = "workers"_kj;
constexpr auto CALL_DEADLINE = 5 * kj::SECONDS;

using Results = capnp::Response<Coordinator::ResultsResults>;

// A worker stopped (SIGSTOP) while it held a lease.
struct Holder {
  std::string name;
  int pid = 0;
  uint32_t index = 0;
  uint64_t leaseId = 0;
  uint32_t taskId = 0;
};

// Blocks until our child `pid` (the launcher runs in this process) has stopped, leaving the
// stop reportable (WNOWAIT). False when it exited instead.
bool waitStopped(int pid) {
  siginfo_t info{};
  int r;
  do {
    r = waitid(P_PID, static_cast<id_t>(pid), &info, WSTOPPED | WEXITED | WNOWAIT);
  } while (r < 0 && errno == EINTR);
  return r == 0 && info.si_code == CLD_STOPPED;
}

std::string argument(uint64_t value) { return std::to_string(value); }

// The demo's steps, each blocking on the loop.
class Demo {
public:
  Demo(troupe::EventLoop& loop, troupe::ActorPool<Coordinator>& coord, troupe::JobHandle workers,
       const DriverOptions& options)
      : loop(loop), coord(coord), workers(kj::mv(workers)), options(options) {}

  Results results() {
    return coord
        .call([](Coordinator::Client c) { return c.resultsRequest().send(); },
              {.deadline = CALL_DEADLINE, .idempotent = true})
        .wait(loop.waitScope());
  }

  bool complete(kj::StringPtr worker, uint64_t leaseId, uint32_t taskId, int64_t result) {
    return coord
        .call(
            [&](Coordinator::Client c) {
              auto q = c.completeRequest();
              q.setWorker(worker);
              q.setLeaseId(leaseId);
              q.setTaskId(taskId);
              q.setResult(result);
              return q.send();
            },
            {.deadline = CALL_DEADLINE, .idempotent = true})
        .wait(loop.waitScope())
        .getAccepted();
  }

  uint32_t workerGone(kj::StringPtr worker) {
    return coord
        .call(
            [&](Coordinator::Client c) {
              auto q = c.workerGoneRequest();
              q.setWorker(worker);
              return q.send();
            },
            {.deadline = CALL_DEADLINE, .idempotent = true})
        .wait(loop.waitScope())
        .getReclaimed();
  }

  // The results once `holds(results)` is true: waits for the coordinator's state to change
  // between checks (waitChange), never polls. Throws `what` when `timeout` passes first, or
  // when the workers job ends with the condition still false.
  template <typename Condition>
  Results waitUntil(Condition&& holds, kj::Duration timeout, const char* what) {
    auto deadline = now() + timeout;
    for (;;) {
      auto r = results();
      if (holds(r)) return r;
      KJ_REQUIRE(!troupe::isFinal(workers.status()), "the workers job ended early", what,
                 troupe::toString(workers.status()), workers.reason());
      KJ_REQUIRE(now() < deadline, "timed out waiting", what);
      awaitChange(r.getVersion(), deadline);
    }
  }

  // Returns once the coordinator's state is past `version`, the workers job has ended, or
  // `deadline` has come.
  void awaitChange(uint64_t version, kj::TimePoint deadline) {
    if (now() >= deadline) return;
    auto change = coord.call(
        [version](Coordinator::Client c) {
          auto q = c.waitChangeRequest();
          q.setAfter(version);
          return q.send();
        },
        {.deadline = deadline - now(), .idempotent = true});
    auto waited = change.ignoreResult().exclusiveJoin(whenWorkersEnd());
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { waited.wait(loop.waitScope()); })) {
      // Past the deadline: the caller's own check says what it was waiting for.
      if (troupe::errorCode(*e) != troupe::ErrorCode::DEADLINE_EXCEEDED) {
        kj::throwFatalException(kj::mv(*e));
      }
    }
  }

  kj::Promise<void> whenWorkersEnd() {
    if (troupe::isFinal(workers.status())) return kj::READY_NOW;
    return workers.whenChanged().then([this]() { return whenWorkersEnd(); });
  }

  kj::TimePoint now() { return loop.timer().now(); }
  kj::Duration elapsedSince(kj::TimePoint start) { return now() - start; }

  // Waits until `count` tasks are done. Throws when the workers job ends first, or after
  // `timeout`.
  Results waitDone(uint32_t count, kj::Duration timeout) {
    return waitUntil([count](Results& r) { return r.getDone().size() >= count; }, timeout,
                     "for tasks to be done");
  }

  // Stops (SIGSTOP) a worker that holds a lease, other than replica `exclude` (-1: none), and
  // returns it; null once every task is done. Throws after 10 s without finding one.
  kj::Maybe<Holder> freezeHolder(int64_t exclude) {
    auto deadline = now() + 10 * kj::SECONDS;
    for (;;) {
      uint64_t version = 0;
      for (auto& replica : workers.replicas()) {
        if (replica.pid == 0) continue;
        if (replica.index == exclude || kill(replica.pid, SIGSTOP) != 0) continue;
        auto name = workerName(WORKERS_JOB, replica.index, replica.pid);
        if (!waitStopped(replica.pid)) continue;  // it exited
        // A complete() the worker sent before it stopped is already in the coordinator's socket
        // (loopback delivers during the send). The coordinator reads it no later than the
        // first results() request, so the second one sees it handled.
        results();
        auto r = results();
        for (auto lease : r.getInFlight()) {
          if (lease.getWorker() == name.c_str()) {
            return Holder{name, replica.pid, replica.index, lease.getLeaseId(), lease.getTaskId()};
          }
        }
        kill(replica.pid, SIGCONT);
        if (r.getDone().size() == options.tasks) return nullptr;
        version = std::max(version, r.getVersion());
      }
      KJ_REQUIRE(now() < deadline, "found no worker holding a lease");
      awaitChange(version, deadline);  // until a lease changes hands
    }
  }

  // Waits until the launcher has seen process `pid` of replica `index` exit.
  void waitExited(uint32_t index, int pid) {
    auto start = loop.timer().now();
    for (;;) {
      bool running = false;
      for (auto& replica : workers.replicas()) {
        if (replica.index == index && replica.pid == pid) running = true;
      }
      if (!running) return;
      KJ_REQUIRE(elapsedSince(start) < 10 * kj::SECONDS, "the killed worker did not exit", pid);
      workers.whenChanged()
          .exclusiveJoin(loop.timer().afterDelay(100 * kj::MILLISECONDS))
          .wait(loop.waitScope());
    }
  }

private:
  troupe::EventLoop& loop;
  troupe::ActorPool<Coordinator>& coord;
  troupe::JobHandle workers;
  const DriverOptions& options;
};

bool isReclaimed(const Results& r, uint64_t leaseId) {
  for (auto c : r.getReclaimed()) {
    if (c.getLease().getLeaseId() == leaseId) return true;
  }
  return false;
}

bool isDoneUnder(const Results& r, uint64_t leaseId) {
  for (auto d : r.getDone()) {
    if (d.getLeaseId() == leaseId) return true;
  }
  return false;
}

// Kills a worker that holds a task, waits for the launcher to see it exit and reports it gone.
Holder killOne(Demo& demo) {
  auto victim = KJ_REQUIRE_NONNULL(demo.freezeHolder(-1),
                                   "every task was done before a worker could be killed");
  KJ_SYSCALL(kill(victim.pid, SIGKILL));
  printf("killed %s (pid %d) with SIGKILL while it held lease %llu on task %u\n",
         victim.name.c_str(), victim.pid, (unsigned long long)victim.leaseId, victim.taskId);
  demo.waitExited(victim.index, victim.pid);
  auto reclaimed = demo.workerGone(victim.name);
  printf("the launcher saw it exit; reported gone, %u lease(s) reclaimed at once\n", reclaimed);
  return victim;
}

// Stalls a worker that holds a task (not replica `exclude`) until its lease expires, then lets
// it go on: its late result must be refused.
Holder stallOne(Demo& demo, uint32_t exclude, kj::Duration lease) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto stalled = KJ_REQUIRE_NONNULL(demo.freezeHolder(exclude),
                                      "every task was done before a worker could be stalled");
    auto start = demo.now();
    auto r = demo.waitUntil(
        [&](Results& r) {
          return isReclaimed(r, stalled.leaseId) || isDoneUnder(r, stalled.leaseId);
        },
        lease + 10 * kj::SECONDS, "for the stalled worker's lease to expire");
    if (isReclaimed(r, stalled.leaseId)) {
      printf("stalled %s with SIGSTOP while it held lease %llu on task %u; the lease expired "
             "%lld ms later and the task was queued again\n",
             stalled.name.c_str(), (unsigned long long)stalled.leaseId, stalled.taskId,
             (long long)(demo.elapsedSince(start) / kj::MILLISECONDS));
      KJ_SYSCALL(kill(stalled.pid, SIGCONT));
      demo.waitUntil([](Results& r) { return r.getRejected() > 0; }, 10 * kj::SECONDS,
                     "for the stalled worker's late result");
      printf("%s resumed with SIGCONT; its late result for task %u was refused\n",
             stalled.name.c_str(), stalled.taskId);
      return stalled;
    }
    // Its complete() landed after all: the lease will never expire. Pick again.
    KJ_SYSCALL(kill(stalled.pid, SIGCONT));
  }
  KJ_FAIL_REQUIRE("could not stall a worker holding a task");
}

// Checks the final results and prints who did what. Returns how many checks failed;
// `fromVictim` gets how many leases were reclaimed from the killed worker.
uint32_t verify(Demo& demo, const DriverOptions& options, const Holder& victim,
                const Holder& stalled, uint32_t& fromVictim) {
  uint32_t failures = 0;
  auto check = [&failures](bool ok, const std::string& what) {
    if (!ok) {
      fprintf(stderr, "MISMATCH: %s\n", what.c_str());
      ++failures;
    }
  };
  auto r = demo.results();
  std::vector<uint32_t> seen(options.tasks, 0);
  std::map<std::string, uint32_t> perWorker;
  for (auto d : r.getDone()) {
    uint32_t id = d.getTaskId();
    if (id >= options.tasks) {
      check(false, "a result for unknown task " + std::to_string(id));
      continue;
    }
    ++seen[id];
    check(d.getResult() == taskValue(id), "task " + std::to_string(id) + " has result " +
                                              std::to_string(d.getResult()) + ", expected " +
                                              std::to_string(taskValue(id)));
    ++perWorker[d.getWorker()];
  }
  for (uint32_t id = 0; id < options.tasks; ++id) {
    check(seen[id] == 1,
          "task " + std::to_string(id) + " was recorded " + std::to_string(seen[id]) + " times");
  }
  check(r.getPending() == 0 && r.getInFlight().size() == 0, "tasks are left queued or leased");

  printf("tasks per worker:\n");
  auto replaced = std::string(WORKERS_JOB.cStr()) + "-" + std::to_string(victim.index) + ".";
  for (auto& [name, count] : perWorker) {
    const char* note = name == victim.name            ? " (killed)"
                       : name == stalled.name         ? " (stalled, then resumed)"
                       : name.rfind(replaced, 0) == 0 ? " (the killed one's replacement)"
                                                      : "";
    printf("  %-22s %3u%s\n", name.c_str(), count, note);
  }

  fromVictim = 0;
  uint32_t fromStalled = 0;
  for (auto c : r.getReclaimed()) {
    if (c.getLease().getWorker() == victim.name.c_str()) ++fromVictim;
    if (c.getLease().getWorker() == stalled.name.c_str() &&
        c.getReason() == Reclaimed::Reason::EXPIRED) {
      ++fromStalled;
    }
  }
  printf("leases reclaimed: %u (%u from the killed worker, %u expired on the stalled one); "
         "late results refused: %u\n",
         r.getReclaimed().size(), fromVictim, fromStalled, r.getRejected());
  check(fromVictim >= 1, "no lease was reclaimed from the killed worker");
  check(fromStalled >= 1, "no lease expired on the stalled worker");
  check(r.getRejected() >= 1, "the stalled worker's late result was not refused");

  // complete() again under a lease already completed: acknowledged, counted once.
  auto first = r.getDone()[0];
  bool again = demo.complete(first.getWorker(), first.getLeaseId(), first.getTaskId(),
                             first.getResult());
  auto r2 = demo.results();
  check(again && r2.getDone().size() == options.tasks &&
            r2.getDuplicates() == r.getDuplicates() + 1,
        "a repeated complete() was not acknowledged once");
  // complete() under the killed worker's revoked lease, as if it had come back: refused.
  bool late = demo.complete(victim.name, victim.leaseId, victim.taskId, taskValue(victim.taskId));
  auto r3 = demo.results();
  check(!late && r3.getRejected() == r2.getRejected() + 1 && r3.getDone().size() == options.tasks,
        "a complete() under a revoked lease was accepted");
  printf("complete() repeated under its lease: acknowledged, counted once; under the killed "
         "worker's revoked lease: refused\n");
  return failures;
}

uint32_t drive(troupe::EventLoop& loop, troupe::LocalLauncher& launcher,
               const DriverOptions& options, uint32_t& fromVictim) {
  auto& ws = loop.waitScope();
  // Small shares: the replicas mostly wait, and the demo must fit a two-core machine.
  auto resources = troupe::ResourceConfig::withCpu(0.1, "64m");
  auto group = troupe::createActorGroup<Coordinator>(
      launcher,
      {.name = COORDINATOR_JOB.cStr(),
       .entrypoint = troupe::Entrypoint::function("coordinator",
                                                  {"--tasks", argument(options.tasks), "--lease-ms",
                                                   argument(options.lease / kj::MILLISECONDS)}),
       .resources = resources,
       .replicas = 1},
      COORDINATOR_ACTOR);
  group->waitReady(1, 30 * kj::SECONDS).wait(ws);
  printf("coordinator ready: %u tasks, leases of %lld ms\n", options.tasks,
         (long long)(options.lease / kj::MILLISECONDS));
  troupe::ActorPool<Coordinator> coord(*group);

  // maxRetriesFailure = 1: the killed worker's replica is started again (a new process, so a
  // new worker name) and the job goes on. With 0 its death would FAIL the job, and the launcher
  // would then stop the surviving workers too.
  auto workers = launcher.submit(
      {.name = WORKERS_JOB.cStr(),
       .entrypoint = troupe::Entrypoint::function(
           "worker", {"--work-ms", argument(options.work / kj::MILLISECONDS)}),
       .resources = resources,
       .replicas = options.workers,
       .maxRetriesFailure = 1});
  printf("workers job submitted: %u replicas\n", options.workers);
  fflush(stdout);

  Demo demo(loop, coord, workers, options);
  demo.waitDone(options.tasks / 5, 60 * kj::SECONDS);
  auto victim = killOne(demo);
  demo.waitDone(2 * options.tasks / 5, 60 * kj::SECONDS);
  auto stalled = stallOne(demo, victim.index, options.lease);
  demo.waitDone(options.tasks, 120 * kj::SECONDS);
  printf("all %u tasks done\n", options.tasks);

  auto failures = verify(demo, options, victim, stalled, fromVictim);

  // Every worker leaves on its own once the coordinator says no task is left.
  auto phase = workers.wait(30 * kj::SECONDS).wait(ws);
  uint32_t starts = 0;
  for (auto& replica : workers.replicas()) starts += replica.starts;
  printf("workers job %s: %u worker processes (%u restarted)\n", troupe::toString(phase).cStr(),
         starts, starts - options.workers);
  if (phase != troupe::JobPhase::SUCCEEDED) {
    fprintf(stderr, "MISMATCH: the workers job ended %s: %s\n", troupe::toString(phase).cStr(),
            workers.reason().c_str());
    ++failures;
  }
  auto coordJob = launcher.find(COORDINATOR_JOB);
  KJ_IF_MAYBE(job, coordJob) {
    job->terminate().wait(ws);
  }
  return failures;
}

}  // namespace

int runDriver(troupe::EventLoop& loop, const DriverOptions& options) {
  kj::Own<troupe::LocalLauncher> owned;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                owned = kj::heap<troupe::LocalLauncher>(
                    loop, troupe::LocalLauncherOptions{.resolver = options.resolver,
                                                       .logDirectory = options.logDirectory,
                                                       .terminateGrace = 5 * kj::SECONDS});
              })) {
    // A malformed resolver URL is bad input; anything else (the log directory) a failure.
    fprintf(stderr, "coord_demo: %s\n", troupe::errorMessage(*e).cStr());
    return troupe::errorCode(*e) == troupe::ErrorCode::INVALID_ARGUMENT ? 2 : 1;
  }
  auto& launcher = *owned;
  printf("replicas log to %s\n", launcher.logDirectory().c_str());
  uint32_t failures = 1;
  uint32_t fromVictim = 0;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { failures = drive(loop, launcher, options, fromVictim); })) {
    fprintf(stderr, "coordinator demo failed: %s\n", e->getDescription().cStr());
    for (auto name : {COORDINATOR_JOB, WORKERS_JOB}) {
      auto job = launcher.find(name);
      KJ_IF_MAYBE(j, job) {
        for (auto& line : j->logs(20)) fprintf(stderr, "%s %s\n", name.cStr(), line.c_str());
      }
    }
  }
  launcher.drain().wait(loop.waitScope());
  if (failures != 0) {
    fprintf(stderr, "coordinator demo FAILED\n");
    return 1;
  }
  printf("coordinator demo passed: %u tasks, each done exactly once (%u reclaimed from the "
         "killed worker)\n",
         options.tasks, fromVictim);
  return 0;
}

}  // namespace coordinator
