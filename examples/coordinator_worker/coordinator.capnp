@0xe6700d840e264a5c;
# The coordinator/worker example's actor interface: a coordinator hands tasks out under leases,
# so that every task is done exactly once even when a worker dies or stalls.
#
# A lease lives while its holder renews it (heartbeat) at least once per lease period. When it
# lapses, or the holder is reported gone, the lease is revoked and its task goes back to the
# front of the queue. A result counts only under the task's live lease: a late complete() under
# a revoked lease is refused. complete() is idempotent: sent again under the same lease with the
# same result, it is acknowledged and not counted twice.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("coordinator");

struct Task {
  id @0 :UInt32;
}

# A task done: its result and the lease it was accepted under.
struct Done {
  taskId @0 :UInt32;
  result @1 :Int64;
  worker @2 :Text;
  leaseId @3 :UInt64;
}

# A lease handed out and not finished.
struct Lease {
  leaseId @0 :UInt64;
  taskId @1 :UInt32;
  worker @2 :Text;
}

# A lease taken back from its holder; its task went back to the queue.
struct Reclaimed {
  lease @0 :Lease;
  reason @1 :Reason;
  enum Reason {
    expired @0;      # no heartbeat renewed it within the lease period
    workerGone @1;   # workerGone() reported its holder dead
  }
}

interface Coordinator {
  # The next task, under a new lease (leaseId != 0) the caller must renew with heartbeat()
  # every leaseMs / 5 or so. leaseId == 0: no task now; `none` says whether every task is done
  # (the worker may exit), otherwise ask again after retryAfterMs (a lease in flight may still
  # come back).
  next @0 (worker :Text) -> (task :Task, leaseId :UInt64, none :Bool, retryAfterMs :UInt32,
                             leaseMs :UInt32);

  # Records `result` for `taskId` under `leaseId`. accepted = false when the lease is not live
  # (revoked, reassigned, unknown) or does not match the worker and task: the result was not
  # recorded. Idempotent: a retry under a lease already completed with the same result is
  # accepted and counted once.
  complete @1 (worker :Text, leaseId :UInt64, taskId :UInt32, result :Int64) -> (accepted :Bool);

  # Renews the caller's leases `leaseIds`; returns those that are no longer live: revoked
  # (their results will be refused), or completed while the heartbeat was on its way.
  heartbeat @2 (worker :Text, leaseIds :List(UInt64)) -> (revoked :List(UInt64));

  # Revokes every lease `worker` holds, at once (its process is known to be dead).
  workerGone @3 (worker :Text) -> (reclaimed :UInt32);

  # The state of the work: tasks done (by task id), queued, leased; leases reclaimed; how many
  # completes were refused and how many were duplicates.
  # `version` counts the changes so far (see waitChange).
  results @4 () -> (tasks :UInt32, done :List(Done), pending :UInt32, inFlight :List(Lease),
                    reclaimed :List(Reclaimed), rejected :UInt32, duplicates :UInt32,
                    version :UInt64);

  # Returns once the state has changed since version `after` (a lease handed out, a task done,
  # a lease reclaimed, a complete refused or repeated), with the version now: a caller waits
  # for a condition with results() and waitChange() instead of polling.
  waitChange @5 (after :UInt64) -> (version :UInt64);
}
