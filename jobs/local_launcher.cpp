#include "troupe/jobs/local_launcher.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include <deque>
#include <map>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/jobs/detail/capacity.h"
#include "troupe/jobs/detail/job_control.h"
#include "troupe/jobs/detail/local_job.h"
#include "troupe/jobs/detail/log_files.h"
#include "troupe/jobs/detail/replica_environment.h"
#include "troupe/resolver/open_resolver.h"
#include "troupe/resolver/registry_server.h"

namespace troupe {

namespace {

std::string defaultLogDirectory() {
  const char* tmp = ::getenv("TMPDIR");
  std::string base = (tmp != nullptr && tmp[0] != '\0') ? tmp : "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + "/troupe-" + std::to_string(::getpid());
}

// The resolver URL of an address a RegistryServer bound.
std::string registryUrl(const std::string& bound) {
  if (bound.rfind("unix:", 0) == 0) return "registry+unix:" + bound.substr(5);
  if (bound.rfind("tcp://", 0) == 0) return "registry://" + bound.substr(6);
  if (bound.rfind("tls://", 0) == 0) return "registry+tls://" + bound.substr(6);
  return bound;
}

}  // namespace

struct LocalLauncher::Impl final : public jobs_detail::LocalJobHost,
                                   private kj::TaskSet::ErrorHandler {
  Impl(EventLoop& loop, LocalLauncherOptions&& opts)
      : loop(loop),
        options(kj::mv(opts)),
        log(options.logger ? options.logger : loop.logger()),
        logDirectory(options.logDirectory.empty() ? defaultLogDirectory() : options.logDirectory),
        ledger(machineOf(options)),
        tasks(*this) {
    // A bad resolver URL is refused before anything is created.
    if (!options.resolver.empty()) {
      url = options.resolver;
      resolver = openResolver(loop, url);
    }
    jobs_detail::makeDirectories(logDirectory);
    if (options.program.empty()) {
      program = "/proc/self/exe";  // the very binary, even if its file was replaced since
      programName = jobs_detail::ownProgramPath();
    } else {
      program = programName = options.program;
    }
    if (options.resolver.empty()) {
      auto server = kj::heap<RegistryServer>(loop, RegistryServerOptions{.logger = log});
      std::string socket = logDirectory + "/registry.sock";
      std::string bound = socket.size() < sizeof(sockaddr_un::sun_path)
                              ? server->listen(kj::str("unix:", socket))
                              : server->listen("tcp://127.0.0.1:0");
      url = registryUrl(bound);
      registry = kj::mv(server);
      resolver = openResolver(loop, url);
    }
    if (options.stopJobsOnSignal) {
      tasks.add(
          loop.onSignal({SIGTERM, SIGINT}).then([this](int signum) { return stopAndDie(signum); }));
    }
    auto m = ledger.machine();
    log->info("local launcher: {} cpus, {} memory, {} GPUs; logs in {}; resolver {}",
              jobs_detail::formatCpus(static_cast<uint64_t>(m.cpus * 1000)),
              jobs_detail::formatBytes(m.ramBytes), m.gpus, logDirectory, url);
  }

  static MachineResources machineOf(const LocalLauncherOptions& options) {
    auto m = jobs_detail::detectMachine();
    if (options.cpus > 0) m.cpus = options.cpus;
    if (options.ramBytes > 0) m.ramBytes = options.ramBytes;
    if (options.gpus >= 0) m.gpus = static_cast<uint32_t>(options.gpus);
    return m;
  }

  // LocalJobHost and TaskSet::ErrorHandler

  // Reports about one job name go out in order (RUNNING before ENDED, a job's ENDED before the
  // RUNNING of the next job of that name); reports about different jobs do not wait for each
  // other, so one slow report holds back only its own job. A report with none ahead of it is
  // sent at once, before anything the caller asks the resolver next (createActorGroup's
  // question about the job's state must find it RUNNING, not a previous job's end).
  kj::Promise<void> reportStatus(JobStatus status, std::string jobCredential) override {
    auto jobId = status.jobId;
    return inOrder(jobId, [this, status = kj::mv(status),
                           credential = kj::mv(jobCredential)]() mutable {
      return kj::evalNow([&]() { return resolver->setJobStatus(status, credential); })
          .catch_([this, status](kj::Exception&& e) {
            log->warn("could not report job {} as {} to {}: {}", status.jobId,
                      toString(status.state).cStr(), url, e.getDescription().cStr());
          });
    });
  }

  kj::Maybe<kj::Own<JobControlOffer>> offerControl(jobs_detail::Job& job, std::string credential,
                                                   const std::string& jobLogDirectory) override {
    return jobs_detail::offerJobControl(*resolver, job, kj::mv(credential), jobLogDirectory);
  }

  kj::Promise<std::string> createJob(std::string jobId, JobDescription description) override {
    struct Outcome {
      kj::Maybe<std::string> credential;
      kj::Maybe<kj::Exception> error;
    };
    auto paf = kj::newPromiseAndFulfiller<std::string>();
    auto sent = inOrder(jobId, [this, jobId, description = kj::mv(description),
                                fulfiller = kj::mv(paf.fulfiller)]() mutable {
      return kj::evalNow([&]() { return resolver->createJob(jobId, description); })
          .then(
              [](std::string c) {
                return Outcome{kj::mv(c), nullptr};
              },
              [](kj::Exception&& e) {
                return Outcome{nullptr, kj::mv(e)};
              })
          .then([fulfiller = kj::mv(fulfiller)](Outcome&& o) mutable {
            KJ_IF_MAYBE(c, o.credential) {
              fulfiller->fulfill(kj::mv(*c));
            } else {
              fulfiller->reject(kj::mv(KJ_ASSERT_NONNULL(o.error)));
            }
          });
    });
    tasks.add(kj::mv(sent));
    return kj::mv(paf.promise);
  }

  // Runs `send` once everything sent about `jobId` before has been answered (at once when
  // nothing is in flight). `send` must not reject. The promise may outlive the launcher (a
  // JobHandle's terminate()): it then resolves.
  kj::Promise<void> inOrder(const std::string& jobId, kj::Function<kj::Promise<void>()> send) {
    auto& job = reports[jobId];
    kj::Promise<void> sent = nullptr;
    KJ_IF_MAYBE(l, job.last) {
      sent = job.inFlight == 0 ? kj::evalNow(kj::mv(send)) : l->addBranch().then(kj::mv(send));
    } else {
      sent = kj::evalNow(kj::mv(send));
    }
    ++job.inFlight;
    auto next = sent.then([&job]() { --job.inFlight; });
    auto forked = next.fork();
    auto mine = forked.addBranch();
    job.last = kj::mv(forked);
    return canceler.wrap(kj::mv(mine)).catch_([](kj::Exception&&) {});
  }

  // Every report made so far, recorded or given up on.
  kj::Promise<void> allReported() {
    auto branches = kj::heapArrayBuilder<kj::Promise<void>>(reports.size());
    for (auto& [name, job] : reports) {
      KJ_IF_MAYBE(l, job.last) {
        branches.add(l->addBranch());
      } else {
        branches.add(kj::READY_NOW);
      }
    }
    return kj::joinPromises(branches.finish());
  }

  void giveBack(const jobs_detail::Allocation& allocation) override {
    ledger.give(allocation);
    scheduleAdmission();
  }

  void jobEnded(jobs_detail::LocalJob&) override { scheduleAdmission(); }

  void taskFailed(kj::Exception&& exception) override {
    log->error("local launcher: {}", exception.getDescription().cStr());
  }

  // Admission

  void scheduleAdmission() {
    if (admissionScheduled) return;
    admissionScheduled = true;
    tasks.add(kj::evalLater([this]() {
      admissionScheduled = false;
      admit();
    }));
  }

  // Starts the queued jobs that fit, in submission order (see LocalLauncherOptions::backfill).
  void admit() {
    kj::Maybe<std::string> blockedBy;
    for (auto it = queue.begin(); it != queue.end();) {
      auto& job = **it;
      if (job.phase() != JobPhase::PENDING) {
        it = queue.erase(it);
        continue;
      }
      auto need = jobs_detail::needOf(job.request().resources);
      uint32_t count = job.request().replicaCount();
      KJ_IF_MAYBE(why, ledger.shortfall(need, count)) {
        job.setPendingReason(*why);
        if (!options.backfill && blockedBy == nullptr) blockedBy = job.id();
        ++it;
        continue;
      }
      KJ_IF_MAYBE(first, blockedBy) {
        job.setPendingReason("it fits, but waits for job '" + *first +
                             "', submitted before it, to start first");
        ++it;
        continue;
      }
      std::vector<jobs_detail::Allocation> allocations;
      for (uint32_t i = 0; i < count; ++i) allocations.push_back(ledger.take(need));
      auto own = kj::mv(*it);
      it = queue.erase(it);
      own->start(kj::mv(allocations));
    }
  }

  JobHandle submit(JobRequest request) {
    KJ_REQUIRE(!shuttingDown, "the launcher was shut down: it takes no new jobs");
    request.validate();
    auto found = jobs.find(request.name);
    if (found != jobs.end() && !isFinal(found->second->phase())) {
      if (request.adopt) return JobHandle(kj::addRef(*found->second));
      throwError(ErrorCode::JOB_ALREADY_EXISTS,
                 kj::str("job '", request.name, "' is already ", toString(found->second->phase()),
                         "; wait for it to end, terminate it, or submit with adopt = true to "
                         "take it over"));
    }
    auto need = jobs_detail::needOf(request.resources);
    uint32_t count = request.replicaCount();
    jobs_detail::LocalJobSettings settings{
        .program = program,
        .programName = programName,
        .resolverUrl = url,
        .logDirectory = logDirectory + "/" + request.name,
        .terminateGrace = options.terminateGrace,
        .resolverPatience = options.resolverPatience,
        .machineGpus = ledger.machine().gpus,
        .logger = log,
    };
    auto name = request.name;
    auto job = kj::refcounted<jobs_detail::LocalJob>(loop, *this, kj::mv(request),
                                                     kj::mv(settings));
    // An ended job of the same name is forgotten; handles to it stay valid, apart from this
    // launcher.
    if (found != jobs.end()) found->second->detach();
    jobs[name] = kj::addRef(*job);
    KJ_IF_MAYBE(why, ledger.neverFits(need, count)) {
      job->unschedulable(*why);
    } else {
      job->setPendingReason("waiting for capacity");
      queue.push_back(kj::addRef(*job));
      admit();
    }
    return JobHandle(kj::mv(job));
  }

  kj::Promise<void> drain(kj::Maybe<kj::Duration> grace) {
    KJ_IF_MAYBE(done, drained) {
      if (grace != nullptr) {
        for (auto& [name, job] : jobs) job->stop(grace, "the launcher shut down");
      }
      return canceler.wrap(done->addBranch());
    }
    shuttingDown = true;
    log->info("local launcher: shutting down");
    auto stops = kj::heapArrayBuilder<kj::Promise<void>>(jobs.size());
    for (auto& [name, job] : jobs) stops.add(job->stop(grace, "the launcher shut down"));
    auto done = kj::joinPromises(stops.finish()).then([this]() {
      // Let the jobs' final states reach the resolver before the program goes.
      return allReported();
    });
    drained = done.fork();
    return canceler.wrap(KJ_ASSERT_NONNULL(drained).addBranch());
  }

  // SIGTERM or SIGINT: every job stops (a second signal hurries it), then the signal gets its
  // default effect.
  kj::Promise<void> stopAndDie(int signum) {
    log->warn("local launcher: {}: stopping every job, then exiting", sigabbrev_np(signum));
    auto hurry = loop.onSignal({SIGTERM, SIGINT}).then([this](int) -> kj::Promise<void> {
      log->warn("local launcher: another signal: killing every replica now");
      for (auto& [name, job] : jobs) job->stop(0 * kj::SECONDS, "the launcher shut down");
      return kj::NEVER_DONE;
    });
    return drain(nullptr).exclusiveJoin(kj::mv(hurry)).then([this, signum]() {
      log->flush();
      ::signal(signum, SIG_DFL);
      ::raise(signum);
    });
  }

  void detachAll() {
    // Promises handed out that still wait on the resolver or on the jobs let go of them.
    canceler.cancel("the launcher was destroyed");
    for (auto& [name, job] : jobs) job->detach();
    queue.clear();
  }

  EventLoop& loop;
  LocalLauncherOptions options;
  std::shared_ptr<spdlog::logger> log;
  std::string logDirectory;
  std::string program;
  std::string programName;
  jobs_detail::CapacityLedger ledger;
  // Declared before what uses them, so destroyed after.
  kj::Maybe<kj::Own<RegistryServer>> registry;
  std::string url;
  kj::Own<Resolver> resolver;
  // The status reports about each job name: the last one (the next follows it) and how many
  // have not finished.
  struct JobReports {
    kj::Maybe<kj::ForkedPromise<void>> last;
    uint32_t inFlight = 0;
  };
  std::map<std::string, JobReports> reports;
  std::map<std::string, kj::Own<jobs_detail::LocalJob>> jobs;  // by name: the latest of each
  std::deque<kj::Own<jobs_detail::LocalJob>> queue;            // PENDING, in submission order
  bool admissionScheduled = false;
  bool shuttingDown = false;
  kj::Maybe<kj::ForkedPromise<void>> drained;
  kj::Canceler canceler;  // wraps what is handed out of the above
  kj::TaskSet tasks;
};

LocalLauncher::LocalLauncher(EventLoop& loop, LocalLauncherOptions options)
    : impl(kj::heap<Impl>(loop, kj::mv(options))) {}

LocalLauncher::~LocalLauncher() noexcept(false) {
  // No replica outlives the launcher: kill and reap what is left, then let go of the jobs
  // (handles may keep them) before the resolver and the registry go.
  impl->detachAll();
}

JobHandle LocalLauncher::submit(JobRequest request) { return impl->submit(kj::mv(request)); }

kj::Maybe<JobHandle> LocalLauncher::find(kj::StringPtr name) {
  auto found = impl->jobs.find(std::string(name.cStr(), name.size()));
  if (found == impl->jobs.end()) return nullptr;
  return JobHandle(kj::addRef(*found->second));
}

Resolver& LocalLauncher::resolver() { return *impl->resolver; }
std::string LocalLauncher::resolverUrl() const { return impl->url; }
EventLoop& LocalLauncher::loop() { return impl->loop; }

kj::Promise<void> LocalLauncher::drain(kj::Maybe<kj::Duration> grace) { return impl->drain(grace); }

MachineResources LocalLauncher::machine() const { return impl->ledger.machine(); }
MachineResources LocalLauncher::available() const { return impl->ledger.available(); }
std::string LocalLauncher::logDirectory() const { return impl->logDirectory; }

}  // namespace troupe
