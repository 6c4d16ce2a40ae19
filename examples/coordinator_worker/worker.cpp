#include "worker.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "coordinator_impl.h"

namespace coordinator {

std::string workerName(const std::string& jobId, uint32_t taskIndex, int pid) {
  return jobId + "-" + std::to_string(taskIndex) + "." + std::to_string(pid);
}

Worker::Worker(kj::Timer& timer, troupe::ActorPool<Coordinator>& pool, WorkerOptions options)
    : timer(timer), pool(pool), options(kj::mv(options)) {}

kj::Promise<void> Worker::run() {
  // heartbeats() never resolves: the work decides when the worker is done.
  return work().exclusiveJoin(heartbeats());
}

kj::Promise<void> Worker::work() {
  // Not idempotent: a second next() would hand out a second lease. A lease whose reply was
  // lost is never renewed, so it lapses and its task is handed out again.
  return pool
      .call(
          [name = options.name](Coordinator::Client c) {
            auto q = c.nextRequest();
            q.setWorker(name);
            return q.send();
          },
          {.deadline = options.callDeadline})
      .then([this](capnp::Response<Coordinator::NextResults>&& r) -> kj::Promise<void> {
        if (r.getLeaseMs() > 0) renewEvery = r.getLeaseMs() / 5 * kj::MILLISECONDS;
        uint64_t leaseId = r.getLeaseId();
        if (leaseId == 0) {
          if (r.getNone()) return kj::READY_NOW;
          return timer.afterDelay(r.getRetryAfterMs() * kj::MILLISECONDS).then([this]() {
            return work();
          });
        }
        return compute(r.getTask().getId(), leaseId).then([this]() { return work(); });
      });
}

kj::Promise<void> Worker::compute(uint32_t taskId, uint64_t leaseId) {
  held.insert(leaseId);
  // The delay stands for real work: long enough that a worker is nearly always holding a task.
  return timer.afterDelay(options.work)
      .then([this, taskId, leaseId]() {
        return pool.call(
            [name = options.name, taskId, leaseId](Coordinator::Client c) {
              auto q = c.completeRequest();
              q.setWorker(name);
              q.setLeaseId(leaseId);
              q.setTaskId(taskId);
              q.setResult(taskValue(taskId));
              return q.send();
            },
            // complete() is idempotent, so the pool may send it again after a lost reply.
            {.deadline = options.callDeadline, .idempotent = true});
      })
      .then([this, taskId, leaseId](capnp::Response<Coordinator::CompleteResults>&& r) {
        held.erase(leaseId);
        if (r.getAccepted()) {
          ++accepted;
        } else {
          ++refused;
          spdlog::warn("{}: result for task {} refused: lease {} was revoked", options.name, taskId,
                       leaseId);
        }
      });
}

kj::Promise<void> Worker::heartbeats() {
  return timer.afterDelay(renewEvery).then([this]() -> kj::Promise<void> {
    if (held.empty()) return heartbeats();
    return pool
        .call(
            [name = options.name, leases = held](Coordinator::Client c) {
              auto q = c.heartbeatRequest();
              q.setWorker(name);
              auto ids = q.initLeaseIds(leases.size());
              size_t i = 0;
              for (uint64_t id : leases) ids.set(i++, id);
              return q.send();
            },
            {.deadline = options.callDeadline, .idempotent = true})
        .then([this](capnp::Response<Coordinator::HeartbeatResults>&& r) {
          // The task goes on: its result will be refused, which is what keeps it exactly once.
          // A lease no longer held was completed while the heartbeat was on its way.
          for (uint64_t id : r.getRevoked()) {
            if (held.count(id) != 0) {
              spdlog::warn("{}: lease {} was revoked while working on it", options.name, id);
            }
          }
          return heartbeats();
        });
  });
}

}  // namespace coordinator
