#include "troupe/jobs/slurm_launcher.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/backoff.h"
#include "troupe/base/errors.h"
#include "troupe/jobs/detail/log_files.h"
#include "troupe/jobs/detail/replica_environment.h"
#include "troupe/jobs/detail/slurm_commands.h"
#include "troupe/jobs/detail/slurm_job.h"
#include "troupe/resolver/open_resolver.h"

extern char** environ;

namespace troupe {

using jobs_detail::CommandOutput;
using jobs_detail::SlurmJob;

namespace {

std::string defaultLogDirectory() {
  const char* home = ::getenv("HOME");
  std::string base = (home != nullptr && home[0] != '\0') ? home : "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + "/.troupe/slurm";
}

// How long after a submission or a signal the launcher polls at least every second.
constexpr kj::Duration FAST_POLLING = 30 * kj::SECONDS;

// The batch script every job runs: its arguments are srun's, so nothing the request holds is
// ever read by a shell.
constexpr const char* BATCH_SCRIPT =
    "#!/bin/sh\n"
    "# Written by troupe's Slurm launcher: each task of this step is one replica of the job.\n"
    "exec srun \"$@\"\n";

void writeBatchScript(const std::string& path) {
  std::string temporary = path + ".new";
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (fd < 0) {
    throwError(ErrorCode::FAILED,
               kj::str("cannot write the batch script '", temporary, "': ", strerror(errno)));
  }
  kj::AutoCloseFd closer(fd);
  kj::FdOutputStream(fd).write(BATCH_SCRIPT, strlen(BATCH_SCRIPT));
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    throwError(ErrorCode::FAILED,
               kj::str("cannot write the batch script '", path, "': ", strerror(errno)));
  }
}

std::vector<std::string> ownEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.push_back(*e);
  return env;
}

// This user's jobs with comment "troupe" that Slurm knows, from squeue (blocking).
std::vector<jobs_detail::SlurmJobInfo> troupeJobs(kj::Duration timeout) {
  std::vector<std::string> argv{"squeue", "--json", "--me", "--states=all"};
  auto out = jobs_detail::runCommandNow(argv, ownEnvironment(), timeout);
  if (!out.status.ok()) {
    throwError(ErrorCode::FAILED, kj::str(jobs_detail::describeFailure(argv, out)));
  }
  std::vector<jobs_detail::SlurmJobInfo> found;
  for (auto& info : jobs_detail::parseSqueueJson(kj::arrayPtr(out.text.data(), out.text.size()))) {
    if (info.comment == "troupe") found.push_back(kj::mv(info));
  }
  return found;
}

}  // namespace

std::vector<SlurmJobSummary> listSlurmJobs(kj::Duration timeout) {
  std::vector<SlurmJobSummary> out;
  for (auto& info : troupeJobs(timeout)) {
    out.push_back(
        SlurmJobSummary{info.name, info.id, info.state, info.reason, info.tasks, info.restarts});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.slurmId > b.slurmId; });
  return out;
}

struct SlurmLauncher::Impl final : public jobs_detail::SlurmJobHost,
                                   private kj::TaskSet::ErrorHandler {
  Impl(EventLoop& loop, SlurmLauncherOptions&& opts)
      : loop(loop),
        options(kj::mv(opts)),
        log(options.logger ? options.logger : loop.logger()),
        logDirectory(options.logDirectory.empty() ? defaultLogDirectory() : options.logDirectory),
        pollBackoff(options.pollInitial, options.pollMax,
                    "SlurmLauncherOptions' pollInitial and pollMax"),
        tasks(*this) {
    if (options.resolver.empty()) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 "SlurmLauncherOptions::resolver is required: the replicas run on the cluster's "
                 "nodes, which must reach it (registry://HOST:PORT or etcd://HOST:PORT)");
    }
    jobs_detail::findCommand("sbatch");  // a clear error now rather than at the first submit
    resolver_ = openResolver(loop, options.resolver);
    jobs_detail::makeDirectories(logDirectory);
    batchScript = logDirectory + "/troupe-batch.sh";
    writeBatchScript(batchScript);
    program = options.program.empty() ? jobs_detail::ownProgramPath() : options.program;
    log->info("slurm launcher: logs in {}; resolver {}{}{}", logDirectory, options.resolver,
              options.partition.empty() ? "" : "; partition ", options.partition);
    findEarlierJobs();
  }

  // The jobs of this user that a launcher submitted (comment "troupe") and that have not
  // ended, the newest of each name: find() and adopt take them over. Read once, blocking.
  void findEarlierJobs() {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  for (auto& info : troupeJobs(options.commandTimeout)) {
                    if (jobs_detail::slurmStateIsFinal(info.state)) continue;
                    auto& kept = earlier[info.name];
                    if (info.id > kept.id) kept = info;
                  }
                })) {
      log->warn("slurm launcher: cannot list the jobs submitted earlier ({}); find() will not "
                "see them",
                e->getDescription().cStr());
    }
  }

  // Takes over the earlier job named `name`, if there is one.
  kj::Maybe<SlurmJob&> adoptEarlier(const std::string& name) {
    auto it = earlier.find(name);
    if (it == earlier.end()) return nullptr;
    JobRequest request{.name = name, .replicas = std::max<uint32_t>(1, it->second.tasks)};
    auto job = kj::refcounted<SlurmJob>(loop, *this, kj::mv(request), settingsFor(name));
    auto& adopted = *job;
    jobs[name] = kj::mv(job);
    auto info = it->second;
    earlier.erase(it);
    adopted.follow(info);
    wake();
    return adopted;
  }

  jobs_detail::SlurmJobSettings settingsFor(const std::string& name) {
    return jobs_detail::SlurmJobSettings{
        .program = program,
        .resolverUrl = options.resolver,
        .logDirectory = logDirectory + "/" + name,
        .batchScript = batchScript,
        .partition = options.partition,
        .timeLimit = options.timeLimit,
        .sbatchArgs = options.sbatchArgs,
        .terminateGrace = options.terminateGrace,
        .submitPatience = options.submitPatience,
        .logger = log,
    };
  }

  ~Impl() noexcept(false) {
    for (auto& [name, job] : jobs) job->detach();
  }

  // SlurmJobHost

  kj::Promise<CommandOutput> run(std::vector<std::string> argv,
                                 std::vector<std::string> env) override {
    if (env.empty()) env = ownEnvironment();
    return kj::evalNow(
        [&]() { return jobs_detail::runCommand(loop, argv, kj::mv(env), options.commandTimeout); });
  }

  Resolver& resolver() override { return *resolver_; }

  void wake() override {
    quietPolls = 0;
    lastWake = loop.timer().now();
    if (!polling) schedulePoll(0 * kj::SECONDS);
  }

  void taskFailed(kj::Exception&& exception) override {
    log->warn("slurm launcher: {}", exception.getDescription().cStr());
  }

  JobHandle submit(JobRequest request) {
    request.validate();
    auto it = jobs.find(request.name);
    if (it != jobs.end() && !isFinal(it->second->phase())) {
      if (request.adopt) return JobHandle(kj::addRef(*it->second));
      throwError(ErrorCode::JOB_ALREADY_EXISTS,
                 kj::str("job '", request.name, "' is ", toString(it->second->phase()),
                         " (Slurm job ", it->second->slurmId(),
                         "); wait for it to end, "
                         "terminate it, or submit with adopt = true to take it over"));
    }
    auto before = earlier.find(request.name);
    if (before != earlier.end()) {
      if (request.adopt) {
        return JobHandle(kj::addRef(KJ_ASSERT_NONNULL(adoptEarlier(request.name))));
      }
      throwError(ErrorCode::JOB_ALREADY_EXISTS,
                 kj::str("job '", request.name, "' runs already as Slurm job ", before->second.id,
                         " (", before->second.state,
                         ", submitted earlier); wait for it to end, "
                         "cancel it, or submit with adopt = true to take it over"));
    }
    auto settings = settingsFor(request.name);
    // A request Slurm cannot express is refused before anything is created.
    jobs_detail::sbatchArguments(request, settings, false);
    auto name = request.name;
    auto job = kj::refcounted<SlurmJob>(loop, *this, kj::mv(request), kj::mv(settings));
    JobHandle handle(kj::addRef(*job));
    job->submit();
    jobs[name] = kj::mv(job);
    return handle;
  }

  void schedulePoll(kj::Duration delay) {
    polling = true;
    auto generation = ++pollGeneration;
    tasks.add(loop.timer().afterDelay(delay).then([this, generation]() -> kj::Promise<void> {
      if (generation != pollGeneration) return kj::READY_NOW;
      return poll().then([this, generation](bool changed) { afterPoll(generation, changed); },
                         [this, generation](kj::Exception&& e) {
                           log->warn("slurm launcher: reading job states failed: {}",
                                     e.getDescription().cStr());
                           afterPoll(generation, false);
                         });
    }));
  }

  void afterPoll(uint64_t generation, bool changed) {
    if (generation != pollGeneration) return;  // woken meanwhile: that poll is the next
    bool any = false;
    for (auto& [name, job] : jobs) any = any || job->polled();
    if (!any) {
      polling = false;
      return;
    }
    // Soon after a submission or a signal something is about to change: look at least every
    // second then; later, back off to pollMax while nothing changes.
    quietPolls = changed ? 0 : quietPolls + 1;
    auto delay = pollBackoff.ceiling(quietPolls);
    if (loop.timer().now() - lastWake < FAST_POLLING) delay = std::min(delay, 1 * kj::SECONDS);
    schedulePoll(delay);
  }

  // One look at every job being followed: squeue for all of them at once, then scontrol for
  // each that squeue shows ended (for its exit code) or no longer shows. Resolves with whether
  // anything changed.
  kj::Promise<bool> poll() {
    std::string ids;
    for (auto& [name, job] : jobs) {
      if (job->polled()) ids += (ids.empty() ? "" : ",") + std::to_string(job->slurmId());
    }
    if (ids.empty()) return false;
    std::vector<std::string> argv{"squeue", "--json", "--states=all", "--jobs=" + ids};
    return run(argv, {}).then([this, argv](CommandOutput out) {
      std::map<uint64_t, jobs_detail::SlurmJobInfo> seen;
      if (out.status.ok()) {
        for (auto& info :
             jobs_detail::parseSqueueJson(kj::arrayPtr(out.text.data(), out.text.size()))) {
          seen[info.id] = info;
        }
      } else if (out.text.find("Invalid job id") == std::string::npos) {
        throwError(ErrorCode::FAILED, kj::str(jobs_detail::describeFailure(argv, out)));
      }
      bool changed = false;
      kj::Vector<kj::Promise<bool>> details;
      for (auto& [name, job] : jobs) {
        if (!job->polled()) continue;
        auto found = seen.find(job->slurmId());
        if (found != seen.end() && !jobs_detail::slurmStateIsFinal(found->second.state)) {
          changed = job->observe(found->second) || changed;
        } else {
          details.add(detailsOf(*job));
        }
      }
      return kj::joinPromises(details.releaseAsArray()).then([changed](kj::Array<bool> more) {
        bool any = changed;
        for (bool c : more) any = any || c;
        return any;
      });
    });
  }

  kj::Promise<bool> detailsOf(SlurmJob& job) {
    auto id = job.slurmId();
    std::vector<std::string> argv{"scontrol", "-o", "show", "job", std::to_string(id)};
    return run(argv, {}).then([&job, id](CommandOutput out) {
      KJ_IF_MAYBE(info, jobs_detail::parseScontrolJob(out.text.c_str())) {
        if (info->id == id && job.polled()) return job.observe(*info);
        return false;
      }
      if (out.text.find("Invalid job id") != std::string::npos && job.polled()) {
        job.vanished();
        return true;
      }
      return false;
    });
  }

  kj::Promise<void> drain(kj::Maybe<kj::Duration> grace) {
    kj::Vector<kj::Promise<void>> all;
    for (auto& [name, job] : jobs) {
      if (!isFinal(job->phase())) {
        all.add(job->terminate(grace).catch_([](kj::Exception&&) {}));
      }
    }
    return kj::joinPromises(all.releaseAsArray());
  }

  EventLoop& loop;
  SlurmLauncherOptions options;
  std::shared_ptr<spdlog::logger> log;
  std::string logDirectory;
  std::string batchScript;
  std::string program;
  kj::Own<Resolver> resolver_;
  std::map<std::string, kj::Own<SlurmJob>> jobs;             // by name: the latest of each
  std::map<std::string, jobs_detail::SlurmJobInfo> earlier;  // submitted before: findEarlierJobs
  const Backoff pollBackoff;  // from pollInitial to pollMax, by polls in a row that saw no change
  uint32_t quietPolls = 0;
  kj::TimePoint lastWake = kj::origin<kj::TimePoint>();
  bool polling = false;
  uint64_t pollGeneration = 0;
  kj::TaskSet tasks;  // last: its tasks use everything above
};

SlurmLauncher::SlurmLauncher(EventLoop& loop, SlurmLauncherOptions options)
    : impl(kj::heap<Impl>(loop, kj::mv(options))) {}

SlurmLauncher::~SlurmLauncher() noexcept(false) {}

JobHandle SlurmLauncher::submit(JobRequest request) { return impl->submit(kj::mv(request)); }

kj::Maybe<JobHandle> SlurmLauncher::find(kj::StringPtr name) {
  auto it = impl->jobs.find(name.cStr());
  if (it != impl->jobs.end()) return JobHandle(kj::addRef(*it->second));
  KJ_IF_MAYBE(adopted, impl->adoptEarlier(name.cStr())) {
    return JobHandle(kj::addRef(*adopted));
  }
  return nullptr;
}

Resolver& SlurmLauncher::resolver() { return *impl->resolver_; }

std::string SlurmLauncher::resolverUrl() const { return impl->options.resolver; }

EventLoop& SlurmLauncher::loop() { return impl->loop; }

kj::Promise<void> SlurmLauncher::drain(kj::Maybe<kj::Duration> grace) { return impl->drain(grace); }

uint64_t SlurmLauncher::slurmJobId(kj::StringPtr name) const {
  auto it = impl->jobs.find(name.cStr());
  return it == impl->jobs.end() ? 0 : it->second->slurmId();
}

std::string SlurmLauncher::logDirectory() const { return impl->logDirectory; }

}  // namespace troupe
