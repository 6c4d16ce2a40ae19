#pragma once
// SlurmLauncher: runs each job as one Slurm job whose tasks are its replicas.
//
//   troupe::SlurmLauncher launcher(loop, {.resolver = "etcd://head:2379/troupe",
//                                         .partition = "gpu"});
//   auto group = troupe::createActorGroup<ParameterServer>(launcher, request, "ps");
//   group->waitReady(4, 10 * kj::MINUTES).wait(loop.waitScope());   // group.job: its JobHandle

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/jobs/launcher.h"

namespace spdlog {
class logger;
}

namespace troupe {

struct SlurmLauncherOptions {
  // The resolver the replicas publish in and job states are reported to (an openResolver()
  // URL). Required: the cluster's nodes must reach it, so there is no embedded default.
  std::string resolver;

  // sbatch --partition; "" (the default): the cluster's default partition.
  std::string partition;

  // sbatch --time, rounded up to whole minutes; 0 (the default): the partition's limit.
  kj::Duration timeLimit = 0 * kj::SECONDS;

  // Where jobs' output goes: <logDirectory>/<job>/replica-<index>.log (one per task, appended to
  // across restarts) and <job>/batch.log (Slurm's and srun's own lines). The tasks write there
  // from the nodes they run on, so it must be a folder every node sees at the same path (a
  // shared filesystem). Created (mode 0700) when missing. Default "": $HOME/.troupe/slurm.
  std::string logDirectory;

  // How long terminate() waits after SIGTERM (scancel --signal=TERM) before cancelling the job
  // outright (scancel), unless told otherwise. Default 10 s.
  kj::Duration terminateGrace = 10 * kj::SECONDS;

  // Slurm pushes nothing: job states are read (squeue --json) this often, from the first to
  // the last, doubling while nothing changes (at most 1 s apart for 30 s after a submission or
  // a terminate). Defaults 250 ms and 5 s.
  kj::Duration pollInitial = 250 * kj::MILLISECONDS;
  kj::Duration pollMax = 5 * kj::SECONDS;

  // How long one Slurm command may take before it is killed and counted as failed. Default
  // 60 s.
  kj::Duration commandTimeout = 60 * kj::SECONDS;

  // How long a submission keeps trying while Slurm's refusal may pass: slurmctld cannot be
  // reached (sbatch says "Unable to contact slurm controller": nothing was submitted), or the
  // request fits no node while some nodes have not registered (just after slurmctld started).
  // It tries again 1 s, 2 s, ... at most 30 s apart, the job PENDING and its reason saying
  // why; after it the job ends as that refusal says. Any other refusal ends the job at once.
  // Default 5 min.
  kj::Duration submitPatience = 5 * kj::MINUTES;

  // More sbatch flags for every job (--account=..., --qos=..., --constraint=...), after
  // troupe's own.
  std::vector<std::string> sbatchArgs;

  // The program a FUNCTION entrypoint's replicas run (see Entrypoints); it must be at the same
  // path on every node. Default "": this very program (/proc/self/exe).
  std::string program;

  // Where the launcher logs (submissions, phases, failures). Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;
};

// A Launcher that submits each job to Slurm with sbatch. Belongs to the loop it was made with;
// its JobHandles belong to that loop too, and stay valid after it is gone.
//
// A job is one Slurm job (a gang: its replicas start together or not at all): sbatch
// --ntasks=<replicas> --cpus-per-task=<cpu, rounded up, at least 1> --mem-per-cpu=<ram / cpus
// per task> (left to the partition's default when the request asks for no memory: on many
// clusters that is a whole node's), --gpus-per-task=<variant>:<count> for GPUs,
// --partition, --time, --requeue when preemptible (--no-requeue otherwise), --job-name=<name>
// and --comment=troupe. The batch script, written once into the log directory, runs
// `srun --kill-on-bad-exit=1` on the entrypoint: each task is a replica, with
// TROUPE_TASK_INDEX taken from SLURM_PROCID (JobContext), and the environment of this process
// plus TROUPE_JOB_ID, TROUPE_NUM_TASKS, TROUPE_RESOLVER, TROUPE_JOB_TOKEN_FILE (a 0600 file in
// the job's log folder), the device's variables and the request's environment (sbatch
// --export=ALL). Nothing built from the request passes through a shell: the program and its
// arguments are the script's arguments.
//
// Phases come from Slurm's own states: PENDING while the job waits (with Slurm's reason,
// "Slurm job 12: Resources"); RUNNING; SUCCEEDED when it completed; FAILED (naming the task and
// its exit status, from srun's lines in batch.log) when a task failed and the retries are
// spent; STOPPED when terminated, or cancelled behind the launcher's back (scancel from a
// shell); UNSCHEDULABLE at once when `sbatch --test-only` refuses the request (a partition that
// does not exist, more than any node has), or when a pending reason says it can never run.
//
// Failures. A task that fails ends the whole step (--kill-on-bad-exit): while the job's
// failures are at most maxRetriesFailure it is requeued (scontrol requeue, then made eligible
// at once: Slurm would hold it two minutes), so every replica starts again as a new
// incarnation; past that the job FAILS. A job asking for retries, or preemptible, is submitted
// with --requeue (Slurm then also requeues it after a node failure or a preemption), any other
// with --no-requeue. A preemptible job that ends PREEMPTED is requeued too, without counting
// against maxRetriesFailure. While slurmctld cannot be reached, submission is tried again (see
// submitPatience): sbatch said then that it submitted nothing, so no job runs twice.
//
// The resolver. The job is created there before it is submitted (its credential goes to the
// replicas through the token file) and ended when it reaches a final phase, with the same
// reasons as the local launcher's, so that its endpoints vanish and waitReady fails at once.
//
// Jobs outlive the launcher: destroying it leaves them running in Slurm (their handles report
// the last phase seen). drain() terminates them. A launcher made later (after this process
// restarted, say) lists this user's jobs that launchers submitted (comment "troupe") once, at
// construction: find() and submit() with adopt follow the newest live one of a name, ending it
// in the resolver with the credential its token file holds; submit() without adopt refuses
// the name (JOB_ALREADY_EXISTS).
class SlurmLauncher final : public Launcher {
public:
  // Opens the resolver, creates the log directory and lists the jobs launchers submitted
  // earlier (squeue, blocking; a failure is logged). Throws INVALID_ARGUMENT for options
  // without a resolver, what openResolver() throws for a bad URL, and FAILED when sbatch is not
  // on PATH or the log directory cannot be created.
  SlurmLauncher(EventLoop& loop, SlurmLauncherOptions options);
  ~SlurmLauncher() noexcept(false);
  KJ_DISALLOW_COPY(SlurmLauncher);

  // See Launcher::submit. Throws INVALID_ARGUMENT for a malformed request and
  // JOB_ALREADY_EXISTS for the name of a job of this launcher that has not ended (unless
  // request.adopt: then its handle is returned). Submission itself runs in the background: the
  // handle is PENDING ("submitting") until sbatch answered.
  JobHandle submit(JobRequest request) override;

  kj::Maybe<JobHandle> find(kj::StringPtr name) override;

  Resolver& resolver() override;
  std::string resolverUrl() const override;
  EventLoop& loop() override;

  // Terminates every job that has not ended (see JobHandle::terminate); resolves once all have.
  kj::Promise<void> drain(kj::Maybe<kj::Duration> grace = nullptr) override;

  // The Slurm job id of a job this launcher submitted; 0 until sbatch answered.
  uint64_t slurmJobId(kj::StringPtr name) const;

  std::string logDirectory() const override;

  struct Impl;

private:
  kj::Own<Impl> impl;
};

// One job a launcher submitted to Slurm, as Slurm reports it now.
struct SlurmJobSummary {
  std::string name;
  uint64_t slurmId = 0;
  std::string state;   // Slurm's: "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", ...
  std::string reason;  // Slurm's reason ("Resources", "None", "NonZeroExitCode", ...)
  uint32_t tasks = 0;  // the job's replicas
  uint32_t restarts = 0;
};

// This user's jobs that launchers submitted (comment "troupe") and Slurm still knows (ended
// ones until MinJobAge passes), newest first. Runs squeue and waits for it (blocking; the
// loop need not run). Throws FAILED with squeue's message when it fails, and what
// SlurmLauncher's constructor throws when squeue is not on PATH.
std::vector<SlurmJobSummary> listSlurmJobs(kj::Duration timeout = 60 * kj::SECONDS);

}  // namespace troupe
