#pragma once
// Launcher: starts a job's replicas and tracks them. JobHandle: one submitted job.

#include <cstdint>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/refcount.h>
#include <kj/timer.h>

#include "troupe/base/event_loop.h"
#include "troupe/jobs/job_request.h"
#include "troupe/pool/actor_group.h"
#include "troupe/resolver/resolver.h"

namespace troupe {

enum class JobPhase : uint8_t {
  PENDING,        // admitted later: waiting for enough free capacity
  RUNNING,        // its replicas are running (some may be restarting)
  SUCCEEDED,      // every replica exited with status 0
  FAILED,         // a replica failed more often than maxRetriesFailure allows
  STOPPED,        // terminated on request (terminate(), or the launcher shut down)
  UNSCHEDULABLE,  // it can never fit this launcher's machine(s)
};

// How the reason of a RUNNING job starts while its launcher has not yet created it in the
// resolver (its replicas wait for the credential): "waiting for the resolver: <why>".
constexpr kj::StringPtr WAITING_FOR_RESOLVER = "waiting for the resolver"_kj;

// "pending", "running", ...
kj::StringPtr toString(JobPhase phase);

// SUCCEEDED, FAILED, STOPPED and UNSCHEDULABLE are final: nothing changes after them.
bool isFinal(JobPhase phase);

// One replica of a job as its launcher sees it.
struct ReplicaInfo {
  uint32_t index = 0;
  int pid = 0;          // of the running process; 0 when none runs
  uint32_t starts = 0;  // how many times it was started (restarts + 1)
  std::string logPath;  // where its stdout and stderr go
  // "waiting" (to be started, or started again), "running", or how it last ended ("exited with
  // status 0", "was killed by signal 9 (SIGKILL)").
  std::string state;
  std::string host;  // where it runs or last ran; "" when the launcher does not know
};

namespace jobs_detail {

// What a launcher keeps for one job; JobHandle's implementation. Loop thread only.
class Job : public kj::Refcounted {
public:
  virtual ~Job() noexcept(false) = default;
  virtual std::string id() const = 0;
  virtual JobPhase phase() const = 0;
  virtual std::string reason() const = 0;
  virtual kj::Promise<void> whenChanged() = 0;
  virtual std::vector<std::string> logs(size_t lines) const = 0;
  virtual kj::Promise<void> terminate(kj::Maybe<kj::Duration> grace) = 0;
  virtual std::vector<ReplicaInfo> replicas() const = 0;
  // What each replica was given, for people (describe(const ResourceConfig&)).
  virtual std::string resources() const = 0;
  // The timer of the loop the job belongs to (JobHandle::wait's timeout).
  virtual kj::Timer& timer() = 0;
};

}  // namespace jobs_detail

// A submitted job. Copies refer to the same job. Belongs to the launcher's loop; valid after
// the launcher is gone (it then reports the job's last phase).
class JobHandle {
public:
  explicit JobHandle(kj::Own<jobs_detail::Job> job) : job(kj::mv(job)) {}
  JobHandle(const JobHandle& other) : job(share(other)) {}
  JobHandle& operator=(const JobHandle& other) {
    job = share(other);
    return *this;
  }
  JobHandle(JobHandle&&) = default;
  JobHandle& operator=(JobHandle&&) = default;

  // The job's id: its request's name.
  std::string id() const { return job->id(); }

  JobPhase status() const { return job->phase(); }

  // Why the job is PENDING, UNSCHEDULABLE, FAILED or STOPPED, for people; "" otherwise.
  std::string reason() const { return job->reason(); }

  // Resolves with the final phase once the job reaches one; rejects with DEADLINE_EXCEEDED
  // (the job goes on) after `timeout`.
  kj::Promise<JobPhase> wait(kj::Duration timeout);

  // Resolves at the job's next change of phase (or of a replica: started, exited).
  kj::Promise<void> whenChanged() { return job->whenChanged(); }

  // The last `lines` lines each replica wrote (stdout and stderr), each prefixed with
  // "[<index>] ", replicas in index order.
  std::vector<std::string> logs(size_t lines) const { return job->logs(lines); }

  // Stops the job: SIGTERM to every replica (a troupe replica drains), SIGKILL to those still
  // running after `grace` (default: the launcher's terminateGrace); a PENDING job is dropped.
  // Resolves once every replica process has exited and the resolver was told the job ended;
  // the job is then STOPPED (unless it had already ended, or was already failing: then it
  // ends as it would have). No process of the job is left behind.
  kj::Promise<void> terminate(kj::Maybe<kj::Duration> grace = nullptr) {
    return job->terminate(grace);
  }

  std::vector<ReplicaInfo> replicas() const { return job->replicas(); }

private:
  // Another reference to `other`'s job. Copying a handle does not change the job; only its
  // reference count, which kj::addRef() counts through a non-const reference.
  static kj::Own<jobs_detail::Job> share(const JobHandle& other) {
    return kj::addRef(const_cast<jobs_detail::Job&>(*other.job));
  }

  kj::Own<jobs_detail::Job> job;
};

// Starts jobs somewhere. Belongs to one loop.
class Launcher {
public:
  virtual ~Launcher() noexcept(false) = default;

  // Validates `request` (JobRequest::validate(): INVALID_ARGUMENT) and starts its replicas, or
  // queues it PENDING until capacity frees, or marks it UNSCHEDULABLE at once (with the reason)
  // when it can never fit. A request named like a job that has not ended is refused with
  // JOB_ALREADY_EXISTS, unless it asks to adopt that job: then the live job's handle is
  // returned. Replicas get TROUPE_JOB_ID (the name), TROUPE_TASK_INDEX, TROUPE_NUM_TASKS,
  // TROUPE_RESOLVER (resolver()'s URL) and the device's variables (see
  // ResourceConfig::deviceEnvironment), then the request's environment.
  virtual JobHandle submit(JobRequest request) = 0;

  // The job named `name`, if this launcher has it (ended jobs included).
  virtual kj::Maybe<JobHandle> find(kj::StringPtr name) = 0;

  // The resolver the replicas publish in, and its URL; the launcher reports job phases there
  // (a job's end ends it in the resolver, so its endpoints vanish and waitReady fails fast).
  virtual Resolver& resolver() = 0;
  virtual std::string resolverUrl() const = 0;

  virtual EventLoop& loop() = 0;

  // Refuses new jobs and stops every job that has not ended (see JobHandle::terminate; `grace`
  // defaults to the launcher's own); resolves once all have ended. Calling it again joins the
  // same drain. Call it, and wait, before destroying the launcher.
  virtual kj::Promise<void> drain(kj::Maybe<kj::Duration> grace = nullptr) = 0;

  // Where the replicas' output goes: <logDirectory>/<job>/replica-<index>.log.
  virtual std::string logDirectory() const = 0;
};

// A job and the group of the actors of one name its replicas host: what createActorGroup
// returns. Use it as the group (`jobGroup->waitReady(...)`, `ActorPool<T> pool(*jobGroup)`) and
// its `job` as the job (`jobGroup.job.terminate()`). Dropping it drops the group, not the job:
// the job runs until it ends, is terminated, or its launcher drains.
template <typename T>
struct JobGroup {
  JobHandle job;
  kj::Own<ActorGroup<T>> group;

  ActorGroup<T>& operator*() { return *group; }
  ActorGroup<T>* operator->() { return group.get(); }
};

// Submits `request` to `launcher` and returns the job with the group of the actors named
// `actorName` that its replicas host (they are expected to publish themselves, e.g. with
// hostActor()). The group borrows the launcher's resolver: the launcher must outlive it.
template <typename T>
JobGroup<T> createActorGroup(Launcher& launcher, JobRequest request, kj::StringPtr actorName,
                             ActorGroupOptions options = {}) {
  auto name = request.name;
  auto job = launcher.submit(kj::mv(request));
  return JobGroup<T>{kj::mv(job), kj::heap<ActorGroup<T>>(launcher.loop(), launcher.resolver(),
                                                          name, actorName, kj::mv(options))};
}

// Where the shell would find program `name`: `name` itself when it holds a '/', else the first
// regular, executable file of that name in $PATH (default /usr/local/bin:/usr/bin:/bin); null
// when there is none. What launchers run an entrypoint's program from.
kj::Maybe<std::string> findProgram(const std::string& name);

}  // namespace troupe
