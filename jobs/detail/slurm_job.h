#pragma once
// SlurmJob: one job of a SlurmLauncher: its submission, its phases as Slurm reports them, its
// requeues and its end. JobHandle's implementation for Slurm jobs.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"
#include "troupe/jobs/detail/slurm_commands.h"
#include "troupe/jobs/launcher.h"
#include "troupe/resolver/resolver.h"

namespace troupe::jobs_detail {

// What a SlurmJob needs of its launcher. Loop thread only.
class SlurmJobHost {
public:
  virtual ~SlurmJobHost() noexcept(false) = default;
  // Runs a Slurm command with this process's environment, or with `env` when it is not empty.
  virtual kj::Promise<CommandOutput> run(std::vector<std::string> argv,
                                         std::vector<std::string> env = {}) = 0;
  virtual Resolver& resolver() = 0;
  // Something changed that the next poll should see soon (a job was submitted or signalled).
  virtual void wake() = 0;
};

// How the launcher has a job submitted.
struct SlurmJobSettings {
  std::string program;       // the executable FUNCTION entrypoints run
  std::string resolverUrl;   // TROUPE_RESOLVER
  std::string logDirectory;  // the job's own: <launcher's log directory>/<job>
  std::string batchScript;   // the launcher's: exec srun "$@"
  std::string partition;
  kj::Duration timeLimit;
  std::vector<std::string> sbatchArgs;
  kj::Duration terminateGrace;
  kj::Duration submitPatience;
  std::shared_ptr<spdlog::logger> logger;
};

// The sbatch command line (after "sbatch") for `request`, and the srun arguments that follow
// the batch script. Throws INVALID_ARGUMENT for a request Slurm cannot express (a TPU).
std::vector<std::string> sbatchArguments(const JobRequest& request,
                                         const SlurmJobSettings& settings, bool testOnly);

// Belongs to the loop it was made on. Borrows its host until detach().
class SlurmJob final : public Job, private kj::TaskSet::ErrorHandler {
public:
  SlurmJob(EventLoop& loop, SlurmJobHost& host, JobRequest request, SlurmJobSettings settings);
  ~SlurmJob() noexcept(false);
  KJ_DISALLOW_COPY(SlurmJob);

  std::string id() const override { return request_.name; }
  JobPhase phase() const override { return phase_; }
  std::string reason() const override { return reason_; }
  kj::Promise<void> whenChanged() override { return changeSignal.next(); }
  std::vector<std::string> logs(size_t lines) const override;
  kj::Promise<void> terminate(kj::Maybe<kj::Duration> grace) override;
  std::vector<ReplicaInfo> replicas() const override;
  std::string resources() const override;
  kj::Timer& timer() override { return loop.timer(); }

  // For the launcher.

  const JobRequest& request() const { return request_; }

  // Creates the job in the resolver, checks the request with sbatch --test-only, submits it.
  void submit();

  // Follows a job an earlier launcher submitted (`info`, from squeue) instead: its credential
  // comes from the token file it left in the job's log folder.
  void follow(const SlurmJobInfo& info);

  // Its Slurm job id; 0 until sbatch answered.
  uint64_t slurmId() const { return slurmId_; }

  // Whether the launcher should poll it: submitted, and not final.
  bool polled() const { return slurmId_ != 0 && !isFinal(phase_) && host != nullptr; }

  // What a poll found. Returns whether anything changed.
  bool observe(const SlurmJobInfo& info);

  // Slurm no longer knows the job (it ended longer ago than MinJobAge).
  void vanished();

  // The launcher is going away: the job runs on in Slurm; this handle stops following it.
  void detach();

private:
  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> createAndSubmit();
  // Why sbatch's refusal `out` may pass (slurmctld cannot be reached, or nodes it has not
  // heard from yet), or nullptr when it was no refusal or one that stands.
  kj::Promise<kj::Maybe<std::string>> passingRefusal(const CommandOutput& out);
  // Runs sbatch (`args`), again with backoff (SUBMIT_BACKOFF; `attempt` is this run's number,
  // from 0) while its refusal may pass (passingRefusal) and `deadline` has not passed.
  kj::Promise<CommandOutput> sbatch(std::vector<std::string> args, std::vector<std::string> env,
                                    kj::TimePoint deadline, uint32_t attempt);
  std::string writeJobToken(const std::string& credential);
  void submitted(uint64_t id);
  // The job ended in Slurm in `state`; `info` holds scontrol's details.
  void endedInSlurm(const SlurmJobInfo& info);
  // Has Slurm run the job again (scontrol requeue, eligible at once); PENDING for `why`.
  void requeue(std::string why);
  // The last line srun wrote about a failing task, if any ("task 1: Exited with exit code 3").
  std::string failedTask() const;
  void setPhase(JobPhase phase, std::string why);
  // Reaches a final phase: the resolver is told, the token file removed.
  void finish(JobPhase phase, std::string why);
  kj::Promise<void> cancel(bool graceful);
  kj::Promise<void> whenFinal();

  EventLoop& loop;
  kj::Maybe<SlurmJobHost&> host;
  JobRequest request_;
  SlurmJobSettings settings;
  JobPhase phase_ = JobPhase::PENDING;
  std::string reason_ = "submitting";
  uint64_t slurmId_ = 0;
  uint32_t failures = 0;
  uint32_t restarts = 0;      // Slurm's restart count seen last
  uint32_t handledEnd = ~0u;  // the restart count whose end was handled (requeued or final)
  bool stopping = false;      // terminate() was called: its end is STOPPED
  std::string stopReason;
  std::string jobCredential;
  kj::Maybe<kj::Own<JobControlOffer>> controlOffer;  // troupe stop and logs, through the resolver
  std::string jobTokenFile;
  kj::Maybe<kj::ForkedPromise<void>> endReported;
  kj::Own<kj::PromiseFulfiller<void>> endFulfiller;
  kj::ForkedPromise<void> stopRequested = nullptr;  // resolves when terminate() is called
  kj::Own<kj::PromiseFulfiller<void>> stopFulfiller;
  ChangeSignal changeSignal;
  kj::Own<kj::TaskSet> tasks;  // last: its tasks use everything above
};

}  // namespace troupe::jobs_detail
