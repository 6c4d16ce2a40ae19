#pragma once
// CoordinatorImpl: the Coordinator actor. Hands tasks 0..tasks-1 out under leases that lapse
// unless renewed, and records each task's result once.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/timer.h>

#include <troupe/base/change_signal.h>

#include "coordinator.capnp.h"

namespace coordinator {

// The result task `id` must have: the sum of the squares 0..id.
int64_t taskValue(uint32_t id);

struct CoordinatorOptions {
  uint32_t tasks = 200;                         // tasks 0..tasks-1
  kj::Duration lease = 500 * kj::MILLISECONDS;  // a lease lapses this long after its last renewal
};

// Belongs to the loop that owns `timer`. Every method but waitChange() is synchronous, so calls
// never interleave inside one; it is hosted with unlimited concurrency so that a waitChange()
// in progress holds nothing up. Checks leases every lease / 10 on `timer` while it exists.
class CoordinatorImpl final : public Coordinator::Server {
public:
  CoordinatorImpl(kj::Timer& timer, CoordinatorOptions options);

protected:
  kj::Promise<void> next(NextContext context) override;
  kj::Promise<void> complete(CompleteContext context) override;
  kj::Promise<void> heartbeat(HeartbeatContext context) override;
  kj::Promise<void> workerGone(WorkerGoneContext context) override;
  kj::Promise<void> results(ResultsContext context) override;
  kj::Promise<void> waitChange(WaitChangeContext context) override;

private:
  struct LiveLease {
    uint32_t taskId;
    std::string worker;
    kj::TimePoint expires;
  };
  struct Result {
    int64_t value;
    std::string worker;
    uint64_t leaseId;
  };
  struct Revoked {
    uint64_t leaseId;
    uint32_t taskId;
    std::string worker;
    Reclaimed::Reason reason;
  };

  // Counts a change and wakes those waiting for one.
  void changed();
  // Takes lease `id` back: its task goes to the front of the queue, to be redone first.
  void revoke(uint64_t id, Reclaimed::Reason reason);
  // Revokes the leases whose time is up, then checks again a tenth of a lease period later.
  kj::Promise<void> sweep();

  kj::Timer& timer;
  const CoordinatorOptions options;
  std::deque<uint32_t> queue;            // tasks waiting for a worker
  std::map<uint64_t, LiveLease> leases;  // by lease id
  std::map<uint32_t, Result> done;       // by task id
  std::vector<Revoked> reclaimed;
  uint64_t nextLeaseId = 1;
  uint32_t rejected = 0;
  uint32_t duplicates = 0;
  uint64_t version = 0;
  troupe::ChangeSignal waiters;  // waitChange() calls
  kj::Promise<void> sweeper;     // last: it runs while the state above exists
};

}  // namespace coordinator
