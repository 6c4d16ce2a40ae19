#pragma once
// The worker side of the coordinator example: asks the coordinator for a task, computes it,
// reports the result, and renews its lease while it works.

#include <cstdint>
#include <set>
#include <string>

#include <kj/async.h>
#include <kj/time.h>

#include <troupe/base/event_loop.h>
#include <troupe/pool/actor_pool.h>

#include "coordinator.capnp.h"

namespace coordinator {

// Where the coordinator is: actor "coordinator" of job "coord".
constexpr kj::StringPtr COORDINATOR_JOB = "coord"_kj;
constexpr kj::StringPtr COORDINATOR_ACTOR = "coordinator"_kj;

// The name a worker gives the coordinator: "<job>-<index>.<pid>", one per process, so that a
// restarted replica (same index, new pid) is a new worker and cannot renew its predecessor's
// leases.
std::string workerName(const std::string& jobId, uint32_t taskIndex, int pid);

struct WorkerOptions {
  std::string name;                             // see workerName()
  kj::Duration work = 20 * kj::MILLISECONDS;    // how long computing one task takes
  kj::Duration callDeadline = 5 * kj::SECONDS;  // for each call to the coordinator
};

// Borrows `timer` and `pool` (the coordinator's), which must outlive it. Loop thread only.
class Worker {
public:
  Worker(kj::Timer& timer, troupe::ActorPool<Coordinator>& pool, WorkerOptions options);

  // Takes tasks until the coordinator says every task is done, renewing the leases it holds
  // meanwhile. Rejects when a call to the coordinator fails.
  kj::Promise<void> run();

  uint32_t accepted = 0;  // results the coordinator recorded
  uint32_t refused = 0;   // results it refused (the lease had been revoked)

private:
  kj::Promise<void> work();
  kj::Promise<void> compute(uint32_t taskId, uint64_t leaseId);
  kj::Promise<void> heartbeats();

  kj::Timer& timer;
  troupe::ActorPool<Coordinator>& pool;
  const WorkerOptions options;
  std::set<uint64_t> held;                           // leases being worked on
  kj::Duration renewEvery = 100 * kj::MILLISECONDS;  // lease / 5, once the coordinator said
};

}  // namespace coordinator
