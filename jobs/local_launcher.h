#pragma once
// LocalLauncher: runs each job's replicas as child processes of this process, on this machine.
//
//   troupe::EventLoop loop;
//   troupe::LocalLauncher launcher(loop);                       // with its own registry
//   auto job = launcher.submit({.name = "ps",
//                               .entrypoint = troupe::Entrypoint::binary("./ps_server"),
//                               .resources = troupe::ResourceConfig::withCpu(2, "4g"),
//                               .replicas = 4});
//   auto phase = job.wait(10 * kj::MINUTES).wait(loop.waitScope());
//   ...
//   launcher.drain().wait(loop.waitScope());                   // on SIGTERM, before exiting

#include <cstdint>
#include <memory>
#include <string>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/jobs/launcher.h"

namespace spdlog {
class logger;
}

namespace troupe {

// What a machine offers jobs.
struct MachineResources {
  double cpus = 0;        // cores
  uint64_t ramBytes = 0;  // memory, bytes
  uint32_t gpus = 0;      // GPUs (any variant)
  bool operator==(const MachineResources&) const = default;
};

struct LocalLauncherOptions {
  // The resolver replicas publish in and job states are reported to (an openResolver() URL,
  // e.g. "registry://127.0.0.1:7700"). Default "": a RegistryServer owned by the launcher,
  // listening on the unix socket <logDirectory>/registry.sock (on tcp://127.0.0.1:0 when that
  // path is too long for a socket), so that a launcher works with nothing else running.
  std::string resolver;

  // Where replicas' output goes: <logDirectory>/<job>/replica-<index>.log. Created (mode 0700)
  // when missing; never removed by the launcher. Default "": $TMPDIR (else /tmp) +
  // "/troupe-<pid>".
  std::string logDirectory;

  // How long terminate() and drain() wait after SIGTERM before SIGKILL, unless told
  // otherwise; also how long a FAILED job's remaining replicas get. Default 10 s.
  kj::Duration terminateGrace = 10 * kj::SECONDS;

  // How long a job may wait for its resolver to create it while the resolver cannot be reached
  // (replicas start only once it has): past it the job FAILS, saying why. 0 (the default): as
  // long as it takes. A resolver that refuses the launcher's credentials fails the job at once.
  kj::Duration resolverPatience = 0 * kj::SECONDS;

  // The machine's capacity jobs are admitted against. 0 (the default) detects it: cores
  // online (sysconf), MemTotal from /proc/meminfo.
  double cpus = 0;
  uint64_t ramBytes = 0;
  // GPUs: -1 (the default) counts the NVIDIA GPUs in /proc/driver/nvidia/gpus/; 0 means none.
  int32_t gpus = -1;

  // Admission order. false (the default): strictly first come, first served; a job that does
  // not fit holds back every job submitted after it (so a large job is never starved). true: a
  // later job that fits starts at once (backfilling; a large job may wait indefinitely).
  bool backfill = false;

  // What SIGTERM and SIGINT delivered to this process do while the launcher exists. true (the
  // default): the launcher stops every job (drain(), with terminateGrace; a second signal
  // cuts the grace short: SIGKILL at once) and then raises the signal again with its default
  // effect, so the program ends as it would have, leaving no replica behind. The loop must be
  // running (any wait() on it) for this to happen; a program waiting for a job sees it STOPPED
  // first, and may exit on its own before the signal is raised again. false: the program handles
  // these signals itself (EventLoop::onSignal) and must call drain() and wait for it before
  // exiting.
  bool stopJobsOnSignal = true;

  // The program a FUNCTION entrypoint's replicas run (see Entrypoints). Default "": this very
  // program (/proc/self/exe).
  std::string program;

  // Where the launcher logs (job starts and ends, restarts, failures). Default: the loop's
  // logger.
  std::shared_ptr<spdlog::logger> logger;
};

// A Launcher whose replicas are child processes of this process. Belongs to the loop it was
// made with; its JobHandles belong to that loop too, and stay valid after it is gone.
//
// Replicas. Each replica is started with uv_spawn as the leader of a process group of its own
// (so that signals reach what it starts too), with the environment of this process plus
// TROUPE_JOB_ID, TROUPE_TASK_INDEX, TROUPE_NUM_TASKS, TROUPE_RESOLVER, the device's variables
// (ResourceConfig::deviceEnvironment, with the GPU indexes the replica was given) and finally
// the request's environment, which wins. Its stdin is /dev/null; its stdout and stderr are
// appended to <logDirectory>/<job>/replica-<index>.log, after a line "--- troupe: ... ---"
// marking each start (a new job of the same name starts the files afresh). When a replica's
// process exits, whatever it left in its process group is killed.
//
// Admission. A job starts only when all of its replicas fit what is free on the machine (cores,
// memory and GPUs, each replica reserving ResourceConfig's cpu, ramBytes and GPU count, which
// are 0, 0 and none unless the request asks for more; disk,
// regions and the GPU variant are not checked); until then it is PENDING, with a reason
// ("needs 4 x 2 cpus, 3 of 8 free"), and it is evaluated again, in submission order, whenever
// capacity frees. A job that could not fit even the empty machine, or that needs a TPU, is
// UNSCHEDULABLE at once. A replica holds its share until it exits with status 0 or the job
// ends.
//
// Failures. A replica that exits with a non-zero status or is killed by a signal is started
// again (a new process: new pid, new incarnation, fresh state; same GPUs) as long as the job's
// failures so far, counted across its replicas, are at most maxRetriesFailure. The failure
// after that FAILS the job: the reason names the replica and how it ended, and the remaining
// replicas are terminated (SIGTERM, SIGKILL after terminateGrace). A program that cannot be
// executed (missing, not executable) FAILS the job at once. When every replica has exited with
// status 0, the job SUCCEEDED. A job reaches a final phase only once none of its processes is
// left.
//
// The resolver. The job is reported RUNNING (Resolver::setJobStatus) before its replicas start,
// so that a reused name registers again, and ENDED when it reaches a final phase, with the
// reason "succeeded", "failed: ...", "stopped: ..." or "unschedulable: ...": its endpoints then
// vanish and ActorGroup::waitReady fails at once with JOB_ENDED. A job's reports go out in order
// (and the RUNNING of a reused name after the ENDED of the job before it); reports about other
// jobs do not wait for them. One that fails is logged and does not hold the job back; one that
// hangs (an unreachable registry) delays its job's start by up to the resolver's call timeout.
//
// Stopping. terminate() sends SIGTERM to a job's process groups and SIGKILL after the grace
// period. drain() terminates every job. On SIGTERM or SIGINT the launcher drains and the
// program then ends by that signal (see LocalLauncherOptions::stopJobsOnSignal); a program that
// handles these signals itself turns that off, and calls drain() and waits for it before
// exiting. Destroying the launcher sends SIGKILL to every replica still running and reaps it
// (blocking), so that no process is left behind; its jobs become STOPPED, but the resolver is not
// told (it goes with the launcher): call drain() first so that it is. When a replica exits,
// what it left in its process group is killed at once, without a grace period of its own.
//
// Limitation: if this process dies without running its destructors (SIGKILL, a crash), replicas
// of BINARY entrypoints keep running: libuv runs no code in the child between fork and exec, so
// the launcher cannot ask for PR_SET_PDEATHSIG there. Replicas of FUNCTION entrypoints ask for
// it themselves (Entrypoints::runIfReplica) and die with the launcher.
class LocalLauncher final : public Launcher {
public:
  // Detects the machine, creates the log directory and starts the embedded registry when no
  // resolver is named. Throws what openResolver() throws for a bad URL, and FAILED when the log
  // directory cannot be created.
  explicit LocalLauncher(EventLoop& loop, LocalLauncherOptions options = {});

  // Kills (SIGKILL) and reaps every replica still running, blocking until they are gone; their
  // jobs become STOPPED. Prefer drain() first.
  ~LocalLauncher() noexcept(false);
  KJ_DISALLOW_COPY(LocalLauncher);

  // See Launcher::submit and the class comment. Throws INVALID_ARGUMENT for a malformed request
  // and JOB_ALREADY_EXISTS for the name of a live job (unless request.adopt: then that job's
  // handle is returned, its request unchanged); a FAILED precondition once drain() was called.
  JobHandle submit(JobRequest request) override;

  kj::Maybe<JobHandle> find(kj::StringPtr name) override;

  Resolver& resolver() override;
  std::string resolverUrl() const override;
  EventLoop& loop() override;

  // Refuses new jobs, drops the PENDING ones (STOPPED) and terminates the running ones
  // (SIGTERM, then SIGKILL after `grace`, default terminateGrace). Resolves when every replica
  // has exited and the resolver was told. Calling it again returns the same wait; with a
  // `grace` that ends sooner, SIGKILL comes sooner.
  kj::Promise<void> drain(kj::Maybe<kj::Duration> grace = nullptr) override;

  // The capacity jobs are admitted against, and what of it is free now.
  MachineResources machine() const;
  MachineResources available() const;

  std::string logDirectory() const override;

  struct Impl;

private:
  kj::Own<Impl> impl;
};

}  // namespace troupe
