#include "troupe/jobs/detail/local_job.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/backoff.h"
#include "troupe/base/errors.h"
#include "troupe/jobs/detail/job_control.h"
#include "troupe/jobs/detail/log_files.h"
#include "troupe/jobs/detail/replica_environment.h"

namespace troupe::jobs_detail {

namespace {

// What the resolver is told when a job ends in `phase` because of `why`.
std::string endedReason(JobPhase phase, const std::string& why) {
  std::string word = toString(phase).cStr();
  return why.empty() ? word : word + ": " + why;
}

// Between attempts to create a job in a resolver that does not answer.
const Backoff CREATE_BACKOFF(100 * kj::MILLISECONDS, 5 * kj::SECONDS);

}  // namespace

LocalJob::LocalJob(EventLoop& loop, LocalJobHost& host, JobRequest request,
                   LocalJobSettings settings)
    : loop(loop),
      host(host),
      request_(kj::mv(request)),
      settings(kj::mv(settings)),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  uint32_t count = request_.replicaCount();
  replicas_.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    replicas_[i].index = i;
    replicas_[i].logPath = this->settings.logDirectory + "/replica-" + std::to_string(i) + ".log";
  }
}

LocalJob::~LocalJob() noexcept(false) {
  // The tasks go first (they refer to the processes); each process is then killed and reaped if
  // it still runs, which only happens when the launcher was never told to let go of the job.
  tasks = nullptr;
  killTimer = nullptr;
}

void LocalJob::taskFailed(kj::Exception&& exception) {
  settings.logger->error("job {}: {}", request_.name, exception.getDescription().cStr());
}

kj::Promise<void> LocalJob::whenChanged() { return changeSignal.next(); }

void LocalJob::changed() { changeSignal.notify(); }

kj::Promise<void> LocalJob::whenFinal() {
  if (isFinal(phase_)) return kj::READY_NOW;
  return whenChanged().then([self = kj::addRef(*this)]() mutable { return self->whenFinal(); });
}

std::vector<std::string> LocalJob::logs(size_t lines) const {
  std::vector<std::string> out;
  for (auto& r : replicas_) {
    auto prefix = "[" + std::to_string(r.index) + "] ";
    for (auto& line : tailLines(r.logPath, lines)) out.push_back(prefix + line);
  }
  return out;
}

std::vector<ReplicaInfo> LocalJob::replicas() const {
  std::vector<ReplicaInfo> out;
  for (auto& r : replicas_) {
    ReplicaInfo info;
    info.index = r.index;
    info.state = "waiting";
    KJ_IF_MAYBE(p, r.process) {
      info.pid = (*p)->pid();
      info.state = "running";
    } else KJ_IF_MAYBE(e, r.lastExit) {
      info.state = describe(*e);
    }
    info.starts = r.starts;
    info.logPath = r.logPath;
    if (r.starts > 0) info.host = hostName();
    out.push_back(kj::mv(info));
  }
  return out;
}

std::string LocalJob::resources() const { return describe(request_.resources); }

void LocalJob::setPendingReason(std::string why) {
  KJ_REQUIRE(phase_ == JobPhase::PENDING, "only a PENDING job waits for capacity");
  if (why == reason_) return;
  reason_ = kj::mv(why);
  changed();
}

void LocalJob::unschedulable(std::string why) {
  KJ_REQUIRE(phase_ == JobPhase::PENDING, "only a PENDING job can be found unschedulable");
  finish(JobPhase::UNSCHEDULABLE, kj::mv(why));
}

void LocalJob::start(std::vector<Allocation> allocations) {
  KJ_REQUIRE(phase_ == JobPhase::PENDING, "only a PENDING job can start");
  KJ_REQUIRE(allocations.size() == replicas_.size(), "one allocation per replica");
  phase_ = JobPhase::RUNNING;
  reason_ = WAITING_FOR_RESOLVER;  // until create() has the credential
  for (size_t i = 0; i < replicas_.size(); ++i) replicas_[i].allocation = kj::mv(allocations[i]);

  // A new job starts its log files afresh (a previous job of the same name wrote there).
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                makeDirectories(settings.logDirectory);
                for (auto& r : replicas_) openLog(r.logPath, true);
              })) {
    finish(JobPhase::FAILED, kj::str("cannot write its logs: ", e->getDescription()).cStr());
    return;
  }
  settings.logger->info("job {}: starting {} replica(s)", request_.name, replicas_.size());
  changed();

  // Replicas start once the resolver has created the job (RUNNING) and given its credential,
  // which they present to register. A name a live job holds elsewhere fails the job.
  create(0);
}

void LocalJob::create(uint32_t attempt) {
  KJ_IF_MAYBE(h, host) {
    creating = true;
    createTried = true;
    tasks->add(
        h->createJob(request_.name, JobDescription{"local", request_.replicaCount()})
            .then(
                [this](std::string credential) {
                  creating = false;
                  jobCredential = kj::mv(credential);
                  KJ_IF_MAYBE(h, host) {
                    controlOffer = h->offerControl(*this, jobCredential, settings.logDirectory);
                  }
                  if (!isFinal(phase_) && ending == nullptr) reason_.clear();
                  if (isFinal(phase_)) {
                    reportEnd();  // stopped while the resolver created it
                    return;
                  }
                  launch();
                },
                [this, attempt](kj::Exception&& e) {
                  creating = false;
                  if (isFinal(phase_)) {
                    // Stopped while the resolver was asked: nothing was created.
                    KJ_IF_MAYBE(f, endReportedLater) {
                      (*f)->fulfill();
                      endReportedLater = nullptr;
                    }
                    return;
                  }
                  auto code = errorCode(e);
                  if (code == ErrorCode::JOB_ALREADY_EXISTS) {
                    nameRefused = true;
                    finish(JobPhase::FAILED, errorMessage(e).cStr());
                    return;
                  }
                  // Asking again cannot help a refusal of the launcher's credentials.
                  if (code == ErrorCode::UNAUTHENTICATED || code == ErrorCode::PERMISSION_DENIED ||
                      code == ErrorCode::INVALID_ARGUMENT) {
                    finish(JobPhase::FAILED,
                           kj::str("the resolver refused to create the job: ", errorMessage(e))
                               .cStr());
                    return;
                  }
                  auto now = loop.timer().now();
                  if (settings.resolverPatience > 0 * kj::SECONDS && createGivesUpAt == nullptr) {
                    createGivesUpAt = now + settings.resolverPatience;
                  }
                  KJ_IF_MAYBE(at, createGivesUpAt) {
                    if (now >= *at) {
                      finish(JobPhase::FAILED,
                             kj::str("the resolver could not create the job within ",
                                     settings.resolverPatience / kj::MILLISECONDS,
                                     " ms: ", errorMessage(e))
                                 .cStr());
                      return;
                    }
                  }
                  // The resolver is unreachable, say: ask again with backoff. The
                  // replicas wait, so that they never register without the credential.
                  auto delay = CREATE_BACKOFF.delay(attempt, loop.random());
                  reason_ = kj::str(WAITING_FOR_RESOLVER, ": ", errorMessage(e)).cStr();
                  settings.logger->warn("job {}: {}; trying again in {} ms", request_.name, reason_,
                                        delay / kj::MILLISECONDS);
                  changed();
                  tasks->add(loop.timer().afterDelay(delay).then([this, attempt]() {
                    if (!isFinal(phase_) && ending == nullptr) create(attempt + 1);
                  }));
                }));
  }
}

std::string LocalJob::writeJobToken() {
  return writeJobTokenFile(logDirectoryRoot(), settings.logDirectory, jobCredential);
}

std::string LocalJob::logDirectoryRoot() const {
  auto slash = settings.logDirectory.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string("/")
                                                  : settings.logDirectory.substr(0, slash);
}

void LocalJob::removeJobToken() {
  if (!jobTokenFile.empty()) ::unlink(jobTokenFile.c_str());
}

void LocalJob::launch() {
  if (isFinal(phase_) || ending != nullptr) return;
  if (!jobCredential.empty()) {
    // Replicas read the credential from a file only the launcher's user can read, never from
    // their command line.
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { jobTokenFile = writeJobToken(); })) {
      finish(JobPhase::FAILED, errorMessage(*e).cStr());
      return;
    }
  }
  for (auto& r : replicas_) {
    if (!startReplica(r)) return;
  }
}

SpawnOptions LocalJob::spawnOptions(const Replica& replica) const {
  SpawnOptions options;
  auto& entrypoint = request_.entrypoint;
  if (entrypoint.kind == Entrypoint::Kind::BINARY) {
    options.file = entrypoint.path;
    options.args.push_back(entrypoint.path);
    options.args.insert(options.args.end(), entrypoint.args.begin(), entrypoint.args.end());
  } else {
    options.file = settings.program;
    options.args.push_back(settings.programName);
    auto rest = Entrypoints::replicaCommandLine(entrypoint);
    options.args.insert(options.args.end(), rest.begin(), rest.end());
  }

  ReplicaEnvironment how;
  how.resolverUrl = settings.resolverUrl;
  how.jobTokenFile = jobTokenFile;
  how.numTasks = static_cast<uint32_t>(replicas_.size());
  how.taskIndex = replica.index;
  KJ_IF_MAYBE(a, replica.allocation) {
    how.gpus = a->gpus;
  }
  how.hideGpus = settings.machineGpus > 0;
  how.launcherPid = static_cast<int>(::getpid());
  options.env = replicaEnvironment(request_, how);
  return options;
}

bool LocalJob::startReplica(Replica& r) {
  ++r.starts;
  std::string marker = "--- troupe: job " + request_.name + ", replica " + std::to_string(r.index) +
                       ", start " + std::to_string(r.starts);
  KJ_IF_MAYBE(previous, r.lastExit) {
    marker += " (its previous run " + describe(*previous) + ")";
  }
  marker += " ---";

  kj::Maybe<kj::Own<Subprocess>> started;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto log = openLog(r.logPath, false);
                appendLine(log, marker.c_str());
                auto options = spawnOptions(r);
                options.outputFd = log;
                KJ_ON_SCOPE_FAILURE(appendLine(log, "--- troupe: the replica could not start ---"));
                started = kj::heap<Subprocess>(loop.uvLoop(), options);
              })) {
    auto why = kj::str("replica ", r.index, " could not start: ", errorMessage(*e));
    settings.logger->error("job {}: {}", request_.name, why.cStr());
    fail(why.cStr());
    return false;
  }
  auto process = kj::mv(KJ_ASSERT_NONNULL(started));
  settings.logger->info("job {}: replica {} started (pid {}, start {})", request_.name, r.index,
                        process->pid(), r.starts);
  tasks->add(process->exited().then([this, index = r.index, start = r.starts](ExitStatus status) {
    replicaExited(index, start, status);
  }));
  r.process = kj::mv(process);
  changed();
  return true;
}

void LocalJob::replicaExited(uint32_t index, uint32_t start, ExitStatus status) {
  auto& r = replicas_[index];
  if (r.starts != start) return;
  pid_t pid = 0;
  KJ_IF_MAYBE(p, r.process) {
    pid = (*p)->pid();
  }
  r.process = nullptr;
  r.lastExit = status;
  auto how = describe(status);
  settings.logger->info("job {}: replica {} (pid {}) {}", request_.name, index, pid, how);

  if (ending != nullptr || isFinal(phase_)) {
    changed();
    maybeFinish();
    return;
  }
  if (status.ok()) {
    r.finished = true;
    release(r);
    for (auto& other : replicas_) {
      if (!other.finished) {
        changed();
        return;
      }
    }
    finish(JobPhase::SUCCEEDED, "");
    return;
  }
  ++failures;
  if (failures <= request_.maxRetriesFailure) {
    settings.logger->warn("job {}: replica {} (pid {}) {}; starting it again (failure {} of {} "
                          "allowed)",
                          request_.name, index, pid, how, failures, request_.maxRetriesFailure);
    startReplica(r);
    return;
  }
  fail("replica " + std::to_string(index) + " (pid " + std::to_string(pid) + ") " + how +
       ": failure " + std::to_string(failures) + ", and maxRetriesFailure is " +
       std::to_string(request_.maxRetriesFailure));
}

void LocalJob::fail(std::string why) {
  if (ending == nullptr) {
    settings.logger->error("job {} fails: {}", request_.name, why);
    beginEnding(JobPhase::FAILED, "failing: ", kj::mv(why));
    armKill(settings.terminateGrace);
  }
  changed();
  maybeFinish();
}

kj::Promise<void> LocalJob::terminate(kj::Maybe<kj::Duration> grace) {
  return stop(grace, "terminated");
}

kj::Promise<void> LocalJob::stop(kj::Maybe<kj::Duration> grace, std::string why) {
  if (phase_ == JobPhase::PENDING) finish(JobPhase::STOPPED, kj::mv(why) + " while pending");
  if (isFinal(phase_)) return whenEndReported();
  if (ending == nullptr) {
    settings.logger->info("job {}: stopping ({})", request_.name, why);
    beginEnding(JobPhase::STOPPED, "stopping: ", kj::mv(why));
  }
  KJ_IF_MAYBE(g, grace) {
    armKill(*g);
  } else {
    armKill(settings.terminateGrace);
  }
  changed();
  maybeFinish();
  return whenFinal().then([self = kj::addRef(*this)]() mutable { return self->whenEndReported(); });
}

void LocalJob::beginEnding(JobPhase phase, const char* what, std::string why) {
  ending = phase;
  endingReason = kj::mv(why);
  reason_ = what + endingReason;
  signalAll(SIGTERM);
}

kj::Promise<void> LocalJob::whenEndReported() {
  KJ_IF_MAYBE(reported, endReported) {
    return reported->addBranch();
  }
  return kj::READY_NOW;
}

void LocalJob::armKill(kj::Duration grace) {
  auto at = loop.timer().now() + grace;
  if (killTimer != nullptr && killAt <= at) return;
  killAt = at;
  killTimer = loop.timer()
                  .atTime(at)
                  .then([this]() { signalAll(SIGKILL); })
                  .eagerlyEvaluate([this](kj::Exception&& e) { taskFailed(kj::mv(e)); });
}

void LocalJob::signalAll(int signum) {
  for (auto& r : replicas_) {
    KJ_IF_MAYBE(p, r.process) {
      (*p)->signalGroup(signum);
    }
  }
}

bool LocalJob::anyRunning() const {
  for (auto& r : replicas_) {
    if (r.process != nullptr) return true;
  }
  return false;
}

void LocalJob::maybeFinish() {
  KJ_IF_MAYBE(phase, ending) {
    if (!anyRunning()) finish(*phase, endingReason);
  }
}

void LocalJob::finish(JobPhase phase, std::string why) {
  KJ_ASSERT(!isFinal(phase_), "a job ends once");
  phase_ = phase;
  reason_ = kj::mv(why);
  ending = nullptr;
  endingReason.clear();
  killTimer = nullptr;
  for (auto& r : replicas_) release(r);
  auto reported = endedReason(phase, reason_);
  if (phase == JobPhase::SUCCEEDED || phase == JobPhase::STOPPED) {
    settings.logger->info("job {} {}", request_.name, reported);
  } else {
    settings.logger->warn("job {} {}", request_.name, reported);
  }
  // The report goes out in the host's order whether or not anyone waits for it; terminate()
  // waits for it. None goes about a name the resolver refused (it is another job's) or never
  // created, nor while the resolver creates the job (its answer sends it, with the credential).
  if (creating) {
    // The resolver's answer sends the report: until then, terminate() waits on this.
    auto paf = kj::newPromiseAndFulfiller<void>();
    endReported = paf.promise.fork();
    endReportedLater = kj::mv(paf.fulfiller);
  } else if (!nameRefused && (!createTried || !jobCredential.empty())) {
    reportEnd();
  }
  KJ_IF_MAYBE(h, host) {
    h->jobEnded(*this);
  }
  changed();
}

void LocalJob::reportEnd() {
  kj::Promise<void> report = kj::READY_NOW;
  KJ_IF_MAYBE(h, host) {
    report = h->reportStatus({request_.name, JobState::ENDED, endedReason(phase_, reason_)},
                             jobCredential);
  }
  KJ_IF_MAYBE(f, endReportedLater) {
    auto fulfiller = kj::mv(*f);
    endReportedLater = nullptr;
    tasks->add(report.then([fulfiller = kj::mv(fulfiller)]() mutable { fulfiller->fulfill(); }));
  } else {
    endReported = report.fork();
  }
  removeJobToken();
}

void LocalJob::release(Replica& r) {
  KJ_IF_MAYBE(a, r.allocation) {
    KJ_IF_MAYBE(h, host) {
      h->giveBack(*a);
    }
  }
  r.allocation = nullptr;
}

void LocalJob::detach() {
  // Cancel what is under way first: the tasks watch the processes about to be killed.
  tasks = kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this));
  killTimer = nullptr;
  for (auto& r : replicas_) {
    r.process = nullptr;  // SIGKILL to its group, reaped
    r.allocation = nullptr;
  }
  host = nullptr;
  controlOffer = nullptr;
  if (!isFinal(phase_)) {
    phase_ = JobPhase::STOPPED;
    reason_ = "the launcher was destroyed";
    ending = nullptr;
  }
  changed();
}

}  // namespace troupe::jobs_detail
