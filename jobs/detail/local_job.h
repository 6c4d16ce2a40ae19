#pragma once
// LocalJob: one job of a LocalLauncher: its replicas as child processes, their restarts, and the
// job's phases. JobHandle's implementation for local jobs.

#include <memory>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"
#include "troupe/jobs/detail/capacity.h"
#include "troupe/jobs/detail/subprocess.h"
#include "troupe/jobs/launcher.h"
#include "troupe/resolver/resolver.h"

namespace troupe::jobs_detail {

class LocalJob;

// What a LocalJob needs of its launcher. Loop thread only.
class LocalJobHost {
public:
  virtual ~LocalJobHost() noexcept(false) = default;

  // Records `status` in the launcher's resolver with the job's credential, after everything
  // sent about that job name before it. Never rejects (a failed report is logged); dropping the
  // promise does not cancel the report.
  virtual kj::Promise<void> reportStatus(JobStatus status, std::string jobCredential) = 0;

  // Creates the job in the launcher's resolver (Resolver::createJob), in the same order as the
  // reports, and resolves with its credential; rejects with what the resolver refused
  // (JOB_ALREADY_EXISTS) or failed with.
  virtual kj::Promise<std::string> createJob(std::string jobId, JobDescription description) = 0;

  // Offers `job`'s control through the launcher's resolver (jobs_detail::offerJobControl).
  virtual kj::Maybe<kj::Own<JobControlOffer>> offerControl(Job& job, std::string credential,
                                                           const std::string& logDirectory) = 0;

  // Takes back one replica's share of the machine: it exited for good, or its job ended.
  virtual void giveBack(const Allocation& allocation) = 0;

  // `job` reached a final phase.
  virtual void jobEnded(LocalJob& job) = 0;
};

// How the launcher has a job's replicas started.
struct LocalJobSettings {
  std::string program;          // the executable FUNCTION entrypoints run
  std::string programName;      // their argv[0]
  std::string resolverUrl;      // TROUPE_RESOLVER
  std::string logDirectory;     // the job's own: <launcher's log directory>/<job>
  kj::Duration terminateGrace;  // before SIGKILL, when no grace is given
  // How long the job may wait for a resolver that cannot be reached to create it; 0: for ever.
  kj::Duration resolverPatience = 0 * kj::SECONDS;
  uint32_t machineGpus = 0;  // when > 0, replicas given no GPU get CUDA_VISIBLE_DEVICES=""
  std::shared_ptr<spdlog::logger> logger;
};

// Belongs to the loop it was made on. Borrows its host until the host calls detach().
//
// Phases: PENDING until start() (or unschedulable(), or a stop while pending); RUNNING from
// start() until no replica process is left and the job's outcome is known; then SUCCEEDED,
// FAILED or STOPPED. While RUNNING and being stopped or failing, reason() says so ("stopping:
// ...", "failing: ...").
class LocalJob final : public Job, private kj::TaskSet::ErrorHandler {
public:
  LocalJob(EventLoop& loop, LocalJobHost& host, JobRequest request, LocalJobSettings settings);
  ~LocalJob() noexcept(false);
  KJ_DISALLOW_COPY(LocalJob);

  std::string id() const override { return request_.name; }
  JobPhase phase() const override { return phase_; }
  std::string reason() const override { return reason_; }
  kj::Promise<void> whenChanged() override;
  std::vector<std::string> logs(size_t lines) const override;
  kj::Promise<void> terminate(kj::Maybe<kj::Duration> grace) override;
  std::vector<ReplicaInfo> replicas() const override;
  std::string resources() const override;
  kj::Timer& timer() override { return loop.timer(); }

  // For the launcher.

  const JobRequest& request() const { return request_; }

  // Still PENDING, because of `why` (observers are told only when the reason changes).
  void setPendingReason(std::string why);

  // PENDING -> RUNNING with one share of the machine per replica: truncates the log files,
  // reports RUNNING to the resolver, and once that is recorded starts every replica.
  void start(std::vector<Allocation> allocations);

  // PENDING -> UNSCHEDULABLE because of `why`.
  void unschedulable(std::string why);

  // Stops the job: see JobHandle::terminate. `why` becomes its reason once STOPPED.
  kj::Promise<void> stop(kj::Maybe<kj::Duration> grace, std::string why);

  // The launcher is going away: kills (SIGKILL) and reaps every replica now, and forgets the
  // host; a job that had not ended becomes STOPPED ("the launcher was destroyed").
  void detach();

private:
  struct Replica {
    uint32_t index = 0;
    std::string logPath;
    uint32_t starts = 0;
    kj::Maybe<kj::Own<Subprocess>> process;
    kj::Maybe<Allocation> allocation;  // held until it exits for good or the job ends
    bool finished = false;             // exited with status 0: not started again
    kj::Maybe<ExitStatus> lastExit;
  };

  void taskFailed(kj::Exception&& exception) override;

  void launch();
  // Asks the host to create the job in its resolver, then launches it (retry `attempt`).
  void create(uint32_t attempt);
  // Tells the host's resolver the job ended (endReported).
  void reportEnd();
  // Writes the job credential to a new 0600 file in the job's log directory, which (like the
  // launcher's) must be this user's and closed to others' writes; returns its path. Throws
  // FAILED otherwise.
  std::string writeJobToken();
  std::string logDirectoryRoot() const;  // the launcher's log directory
  // Removes the credential file once the job ended.
  void removeJobToken();
  bool startReplica(Replica& replica);
  SpawnOptions spawnOptions(const Replica& replica) const;
  void replicaExited(uint32_t index, uint32_t start, ExitStatus status);
  void fail(std::string why);
  // RUNNING, being stopped or failing: ends in `phase` once no process is left; SIGTERM to all.
  void beginEnding(JobPhase phase, const char* what, std::string why);
  // Once the resolver has recorded the job's end (at once when no report was made).
  kj::Promise<void> whenEndReported();
  void armKill(kj::Duration grace);
  void signalAll(int signum);
  bool anyRunning() const;
  void maybeFinish();
  void finish(JobPhase phase, std::string why);
  void release(Replica& replica);
  void changed();
  kj::Promise<void> whenFinal();

  EventLoop& loop;
  kj::Maybe<LocalJobHost&> host;
  JobRequest request_;
  LocalJobSettings settings;
  JobPhase phase_ = JobPhase::PENDING;
  std::string reason_;
  std::vector<Replica> replicas_;
  uint32_t failures = 0;
  // Set while RUNNING once the job is being stopped (STOPPED) or failing (FAILED): the phase it
  // ends in when its last process has exited, and why.
  kj::Maybe<JobPhase> ending;
  std::string endingReason;
  kj::Maybe<kj::Promise<void>> killTimer;
  kj::Maybe<kj::ForkedPromise<void>> endReported;  // the resolver has recorded the job's end
  std::string jobCredential;  // from the resolver's createJob(); empty until then
  kj::Maybe<kj::Own<JobControlOffer>> controlOffer;
  kj::Maybe<kj::TimePoint> createGivesUpAt;  // after a first failure, with resolverPatience  //
                                             // troupe stop and logs, through the resolver
  std::string jobTokenFile;                  // where the replicas read it (TROUPE_JOB_TOKEN_FILE)
  bool nameRefused = false;  // the resolver refused the name: report nothing about it
  bool creating = false;     // the resolver's createJob() has not answered yet
  bool createTried = false;  // create() was called (an unschedulable job never gets there)
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> endReportedLater;  // ended while creating
  kj::TimePoint killAt = kj::origin<kj::TimePoint>();
  ChangeSignal changeSignal;
  kj::Own<kj::TaskSet> tasks;  // last: its tasks use everything above
};

}  // namespace troupe::jobs_detail
