#include "coordinator_impl.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

namespace coordinator {

int64_t taskValue(uint32_t id) {
  int64_t sum = 0;
  for (int64_t i = 0; i <= id; ++i) sum += i * i;
  return sum;
}

CoordinatorImpl::CoordinatorImpl(kj::Timer& timer, CoordinatorOptions options)
    : timer(timer), options(options), sweeper(nullptr) {
  KJ_REQUIRE(options.lease > 0 * kj::SECONDS, "the lease period must be positive");
  for (uint32_t id = 0; id < options.tasks; ++id) queue.push_back(id);
  sweeper = sweep().eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::error("lease sweeper stopped: {}", e.getDescription().cStr());
  });
}

kj::Promise<void> CoordinatorImpl::next(NextContext context) {
  auto worker = context.getParams().getWorker();
  auto results = context.getResults();
  results.setLeaseMs(options.lease / kj::MILLISECONDS);
  if (queue.empty()) {
    // Nothing to hand out. While leases are in flight one may lapse and its task come back, so
    // the worker must not leave yet.
    results.setNone(leases.empty());
    results.setRetryAfterMs(options.lease / kj::MILLISECONDS / 5);
    return kj::READY_NOW;
  }
  uint32_t taskId = queue.front();
  queue.pop_front();
  uint64_t id = nextLeaseId++;
  leases.emplace(id, LiveLease{taskId, worker, timer.now() + options.lease});
  results.initTask().setId(taskId);
  results.setLeaseId(id);
  changed();
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorImpl::complete(CompleteContext context) {
  auto p = context.getParams();
  kj::StringPtr worker = p.getWorker();
  uint64_t leaseId = p.getLeaseId();
  uint32_t taskId = p.getTaskId();
  int64_t value = p.getResult();
  auto it = leases.find(leaseId);
  if (it != leases.end() && it->second.worker == worker.cStr() && it->second.taskId == taskId) {
    // The live lease: the one and only time this task's result is recorded.
    KJ_ASSERT(done.count(taskId) == 0, "a task was leased again after it was done", taskId);
    done.emplace(taskId, Result{value, it->second.worker, leaseId});
    leases.erase(it);
    context.getResults().setAccepted(true);
    changed();
    return kj::READY_NOW;
  }
  auto d = done.find(taskId);
  if (d != done.end() && d->second.leaseId == leaseId && d->second.worker == worker.cStr()) {
    // A retry of a complete that was recorded (its reply may have been lost): acknowledge it
    // again, count it once. A different result under the same lease is a broken worker.
    ++duplicates;
    bool same = d->second.value == value;
    if (!same) {
      spdlog::warn("{} completed task {} twice under lease {} with different results",
                   worker.cStr(), taskId, leaseId);
    }
    context.getResults().setAccepted(same);
    changed();
    return kj::READY_NOW;
  }
  // A lease that was revoked (and maybe reassigned), or one this worker never held.
  ++rejected;
  spdlog::info("refused {}'s result for task {}: lease {} is not a live lease of theirs for it",
               worker.cStr(), taskId, leaseId);
  context.getResults().setAccepted(false);
  changed();
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorImpl::heartbeat(HeartbeatContext context) {
  auto p = context.getParams();
  kj::StringPtr worker = p.getWorker();
  std::vector<uint64_t> revoked;
  auto expires = timer.now() + options.lease;
  for (uint64_t id : p.getLeaseIds()) {
    auto it = leases.find(id);
    if (it != leases.end() && it->second.worker == worker.cStr()) {
      it->second.expires = expires;
    } else {
      revoked.push_back(id);
    }
  }
  auto out = context.getResults().initRevoked(revoked.size());
  for (size_t i = 0; i < revoked.size(); ++i) out.set(i, revoked[i]);
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorImpl::workerGone(WorkerGoneContext context) {
  kj::StringPtr worker = context.getParams().getWorker();
  std::vector<uint64_t> held;
  for (auto& [id, lease] : leases) {
    if (lease.worker == worker.cStr()) held.push_back(id);
  }
  for (uint64_t id : held) revoke(id, Reclaimed::Reason::WORKER_GONE);
  context.getResults().setReclaimed(held.size());
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorImpl::results(ResultsContext context) {
  auto r = context.getResults();
  r.setTasks(options.tasks);
  auto doneList = r.initDone(done.size());
  size_t i = 0;
  for (auto& [taskId, result] : done) {
    auto d = doneList[i++];
    d.setTaskId(taskId);
    d.setResult(result.value);
    d.setWorker(result.worker);
    d.setLeaseId(result.leaseId);
  }
  r.setPending(queue.size());
  auto inFlight = r.initInFlight(leases.size());
  i = 0;
  for (auto& [id, lease] : leases) {
    auto l = inFlight[i++];
    l.setLeaseId(id);
    l.setTaskId(lease.taskId);
    l.setWorker(lease.worker);
  }
  auto reclaimedList = r.initReclaimed(reclaimed.size());
  for (i = 0; i < reclaimed.size(); ++i) {
    auto l = reclaimedList[i].initLease();
    l.setLeaseId(reclaimed[i].leaseId);
    l.setTaskId(reclaimed[i].taskId);
    l.setWorker(reclaimed[i].worker);
    reclaimedList[i].setReason(reclaimed[i].reason);
  }
  r.setRejected(rejected);
  r.setDuplicates(duplicates);
  r.setVersion(version);
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorImpl::waitChange(WaitChangeContext context) {
  uint64_t after = context.getParams().getAfter();
  kj::Promise<void> wait = version > after ? kj::Promise<void>(kj::READY_NOW) : waiters.next();
  return wait.then([this, context]() mutable { context.getResults().setVersion(version); });
}

void CoordinatorImpl::changed() {
  ++version;
  waiters.notify();
}

void CoordinatorImpl::revoke(uint64_t id, Reclaimed::Reason reason) {
  auto it = leases.find(id);
  KJ_ASSERT(it != leases.end());
  auto& lease = it->second;
  spdlog::info("lease {} on task {} taken back from {} ({}); the task is queued again", id,
               lease.taskId, lease.worker,
               reason == Reclaimed::Reason::EXPIRED ? "lease expired" : "worker gone");
  queue.push_front(lease.taskId);
  reclaimed.push_back({id, lease.taskId, kj::mv(lease.worker), reason});
  leases.erase(it);
  changed();
}

kj::Promise<void> CoordinatorImpl::sweep() {
  return timer.afterDelay(options.lease / 10).then([this]() {
    auto now = timer.now();
    std::vector<uint64_t> lapsed;
    for (auto& [id, lease] : leases) {
      if (lease.expires <= now) lapsed.push_back(id);
    }
    for (uint64_t id : lapsed) revoke(id, Reclaimed::Reason::EXPIRED);
    return sweep();
  });
}

}  // namespace coordinator
