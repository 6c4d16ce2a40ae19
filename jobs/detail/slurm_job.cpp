#include "troupe/jobs/detail/slurm_job.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/backoff.h"
#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"
#include "troupe/jobs/detail/job_control.h"
#include "troupe/jobs/detail/log_files.h"
#include "troupe/jobs/detail/replica_environment.h"

namespace troupe::jobs_detail {

namespace {

// The waits between submissions while sbatch's refusal may pass: 1 s, doubling to 30 s.
const Backoff SUBMIT_BACKOFF(1 * kj::SECONDS, 30 * kj::SECONDS);

// What the resolver is told when a job ends in `phase` because of `why`.
std::string endedReason(JobPhase phase, const std::string& why) {
  std::string word = toString(phase).cStr();
  return why.empty() ? word : word + ": " + why;
}

// Slurm states in which the job holds (or is getting) its nodes.
bool slurmRunning(kj::StringPtr state) {
  for (auto s : {"RUNNING", "CONFIGURING", "COMPLETING", "RESIZING", "STAGE_OUT", "SIGNALING",
                 "SUSPENDED"}) {
    if (state == s) return true;
  }
  return false;
}

// The first line of `text` without its newline.
std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Whether sbatch's refusal means the request can never run here (rather than a passing fault).
bool refusalIsFinal(const std::string& text) {
  for (auto never :
       {"Requested node configuration is not available", "invalid partition",
        "Invalid generic resource", "Invalid account", "Invalid qos",
        "More processors requested than permitted", "Memory specification can not be satisfied",
        "Requested time limit is invalid", "Invalid feature specification"}) {
    if (text.find(never) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> sbatchArguments(const JobRequest& request,
                                         const SlurmJobSettings& settings, bool testOnly) {
  auto& resources = request.resources;
  if (std::holds_alternative<TpuDevice>(resources.device)) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("job '", request.name,
                       "' asks for a TPU; the Slurm launcher runs CPU and "
                       "GPU jobs"));
  }
  std::vector<std::string> args{"sbatch", "--parsable"};
  if (testOnly) args.push_back("--test-only");
  uint32_t cpus = std::max<uint32_t>(1, static_cast<uint32_t>(std::ceil(resources.cpu)));
  args.push_back("--job-name=" + request.name);
  args.push_back("--comment=troupe");
  args.push_back("--ntasks=" + std::to_string(request.replicaCount()));
  args.push_back("--cpus-per-task=" + std::to_string(cpus));
  if (resources.ramBytes > 0) {
    uint64_t mib = (resources.ramBytes + (uint64_t{cpus} << 20) - 1) / (uint64_t{cpus} << 20);
    args.push_back("--mem-per-cpu=" + std::to_string(mib) + "M");
  }
  if (auto* gpu = std::get_if<GpuDevice>(&resources.device)) {
    args.push_back("--gpus-per-task=" + gpu->variant + ":" + std::to_string(gpu->count));
  }
  if (!settings.partition.empty()) args.push_back("--partition=" + settings.partition);
  if (settings.timeLimit > 0 * kj::SECONDS) {
    auto minutes = (settings.timeLimit + kj::MINUTES - 1 * kj::NANOSECONDS) / kj::MINUTES;
    args.push_back("--time=" + std::to_string(minutes));
  }
  // Requeued after a failure (maxRetriesFailure) or a preemption; never otherwise.
  bool requeue = resources.preemptible || request.maxRetriesFailure > 0;
  args.push_back(requeue ? "--requeue" : "--no-requeue");
  args.push_back("--output=" + settings.logDirectory + "/batch.log");
  args.push_back("--open-mode=append");
  args.insert(args.end(), settings.sbatchArgs.begin(), settings.sbatchArgs.end());
  // The batch script runs `srun "$@"`: what follows are srun's arguments, never a shell's.
  args.push_back(settings.batchScript);
  args.push_back("--kill-on-bad-exit=1");
  args.push_back("--output=" + settings.logDirectory + "/replica-%t.log");
  args.push_back("--open-mode=append");
  auto& entrypoint = request.entrypoint;
  if (entrypoint.kind == Entrypoint::Kind::BINARY) {
    args.push_back(entrypoint.path);
    args.insert(args.end(), entrypoint.args.begin(), entrypoint.args.end());
  } else {
    args.push_back(settings.program);
    auto rest = Entrypoints::replicaCommandLine(entrypoint);
    args.insert(args.end(), rest.begin(), rest.end());
  }
  return args;
}

SlurmJob::SlurmJob(EventLoop& loop, SlurmJobHost& host, JobRequest request,
                   SlurmJobSettings settings)
    : loop(loop),
      host(host),
      request_(kj::mv(request)),
      settings(kj::mv(settings)),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  endReported = paf.promise.fork();
  endFulfiller = kj::mv(paf.fulfiller);
  auto stop = kj::newPromiseAndFulfiller<void>();
  stopRequested = stop.promise.fork();
  stopFulfiller = kj::mv(stop.fulfiller);
}

SlurmJob::~SlurmJob() noexcept(false) {}

void SlurmJob::taskFailed(kj::Exception&& exception) {
  settings.logger->error("slurm launcher: job {}: {}", request_.name,
                         exception.getDescription().cStr());
}

std::vector<std::string> SlurmJob::logs(size_t lines) const {
  std::vector<std::string> out;
  for (uint32_t i = 0; i < request_.replicaCount(); ++i) {
    auto path = settings.logDirectory + "/replica-" + std::to_string(i) + ".log";
    for (auto& line : tailLines(path, lines)) out.push_back("[" + std::to_string(i) + "] " + line);
  }
  return out;
}

std::vector<ReplicaInfo> SlurmJob::replicas() const {
  std::vector<ReplicaInfo> out;
  bool started = phase_ != JobPhase::PENDING || restarts > 0;
  for (uint32_t i = 0; i < request_.replicaCount(); ++i) {
    ReplicaInfo info;
    info.index = i;
    info.starts = started ? restarts + 1 : 0;
    info.logPath = settings.logDirectory + "/replica-" + std::to_string(i) + ".log";
    // Slurm runs the replicas on its nodes, as one step: their pids are not the launcher's.
    info.state = phase_ == JobPhase::RUNNING   ? "running"
                 : phase_ == JobPhase::PENDING ? "waiting"
                                               : toString(phase_).cStr();
    out.push_back(kj::mv(info));
  }
  return out;
}

std::string SlurmJob::resources() const { return describe(request_.resources); }

void SlurmJob::setPhase(JobPhase phase, std::string why) {
  if (isFinal(phase_) || (phase == phase_ && why == reason_)) return;
  if (phase != phase_) {
    settings.logger->info("slurm launcher: job {} (Slurm job {}) is {}{}{}", request_.name,
                          slurmId_, toString(phase).cStr(), why.empty() ? "" : ": ", why);
  }
  phase_ = phase;
  reason_ = kj::mv(why);
  changeSignal.notify();
}

void SlurmJob::submit() {
  tasks->add(createAndSubmit().catch_(
      [this](kj::Exception&& e) { finish(JobPhase::FAILED, errorMessage(e).cStr()); }));
}

kj::Promise<void> SlurmJob::createAndSubmit() {
  auto& h = KJ_ASSERT_NONNULL(host);
  makeDirectories(settings.logDirectory);
  // A new job of this name starts its files afresh.
  for (uint32_t i = 0; i < request_.replicaCount(); ++i) {
    ::unlink((settings.logDirectory + "/replica-" + std::to_string(i) + ".log").c_str());
  }
  ::unlink((settings.logDirectory + "/batch.log").c_str());
  auto testArgs = sbatchArguments(request_, settings, true);
  return h.resolver()
      .createJob(request_.name, JobDescription{"slurm", request_.replicaCount()})
      .then([this, testArgs](std::string credential) {
        jobCredential = kj::mv(credential);
        KJ_IF_MAYBE(live, host) {
          controlOffer = offerJobControl(live->resolver(), *this, jobCredential,
                                         settings.logDirectory);
        }
        jobTokenFile =
            writeJobTokenFile(settings.logDirectory.substr(0, settings.logDirectory.rfind('/')),
                              settings.logDirectory, jobCredential);
        return sbatch(testArgs, {}, loop.timer().now() + settings.submitPatience, 0);
      })
      .then([this, testArgs](CommandOutput tested) -> kj::Promise<void> {
        if (stopping) {
          finish(JobPhase::STOPPED, stopReason);
          return kj::READY_NOW;
        }
        if (!tested.status.ok()) {
          auto why = describeFailure(testArgs, tested);
          finish(refusalIsFinal(tested.text) ? JobPhase::UNSCHEDULABLE : JobPhase::FAILED, why);
          return kj::READY_NOW;
        }
        ReplicaEnvironment how;
        how.resolverUrl = settings.resolverUrl;
        how.jobTokenFile = jobTokenFile;
        how.numTasks = request_.replicaCount();
        auto args = sbatchArguments(request_, settings, false);
        return sbatch(args, replicaEnvironment(request_, how),
                      loop.timer().now() + settings.submitPatience, 0)
            .then([this, args](CommandOutput out) {
              // `sbatch --parsable` prints "ID" or "ID;CLUSTER".
              auto printed = firstLine(out.text);
              printed = printed.substr(0, printed.find(';'));
              uint64_t id = 0;
              if (out.status.ok()) {
                id = parseWholeNumber(kj::arrayPtr(printed.data(), printed.size())).orDefault(0);
              }
              if (id == 0) {
                auto why = out.status.ok() ? "sbatch printed no job id: " + firstLine(out.text)
                                           : describeFailure(args, out);
                finish(refusalIsFinal(out.text) ? JobPhase::UNSCHEDULABLE : JobPhase::FAILED, why);
                return;
              }
              submitted(id);
            });
      });
}

kj::Promise<kj::Maybe<std::string>> SlurmJob::passingRefusal(const CommandOutput& out) {
  if (out.status.ok()) return kj::Maybe<std::string>(nullptr);
  if (out.text.find("Unable to contact slurm controller") != std::string::npos) {
    return kj::Maybe<std::string>(std::string("slurmctld cannot be reached"));
  }
  if (out.text.find("Requested node configuration is not available") == std::string::npos) {
    return kj::Maybe<std::string>(nullptr);
  }
  // Said also of nodes slurmctld has not heard from yet (just after it started): their
  // resources are unknown, so the request may fit once they register.
  std::vector<std::string> sinfo{"sinfo", "--noheader", "--format=%t"};
  if (!settings.partition.empty()) sinfo.push_back("--partition=" + settings.partition);
  return KJ_ASSERT_NONNULL(host).run(sinfo).then([](CommandOutput nodes) {
    std::istringstream lines(nodes.text);
    std::string state;
    while (std::getline(lines, state)) {
      if (state.rfind("unk", 0) == 0 || state.find('*') != std::string::npos) {
        return kj::Maybe<std::string>(std::string("some nodes have not registered with Slurm"));
      }
    }
    return kj::Maybe<std::string>(nullptr);
  });
}

kj::Promise<CommandOutput> SlurmJob::sbatch(std::vector<std::string> args,
                                            std::vector<std::string> env, kj::TimePoint deadline,
                                            uint32_t attempt) {
  auto ran = KJ_ASSERT_NONNULL(host).run(args, env);
  return ran
      .then([this](CommandOutput out) {
        auto judged = passingRefusal(out);
        return judged.then([out = kj::mv(out)](kj::Maybe<std::string> passing) mutable {
          return std::make_pair(kj::mv(out), kj::mv(passing));
        });
      })
      .then([this, args = kj::mv(args), env = kj::mv(env), deadline,
             attempt](std::pair<CommandOutput, kj::Maybe<std::string>> result) mutable
            -> kj::Promise<CommandOutput> {
        auto& [out, passing] = result;
        KJ_IF_MAYBE(why, passing) {
          auto pause = SUBMIT_BACKOFF.ceiling(attempt);
          if (!stopping && host != nullptr && loop.timer().now() + pause <= deadline) {
            auto seconds = std::to_string(pause / kj::SECONDS);
            settings.logger->warn("slurm launcher: job {}: {}; submitting again in {} s",
                                  request_.name, *why, seconds);
            setPhase(JobPhase::PENDING, "submitting: " + *why + " (" + firstLine(out.text) +
                                            "); trying again in " + seconds + " s");
            return loop.timer()
                .afterDelay(pause)
                .exclusiveJoin(stopRequested.addBranch())
                .then([this, out = kj::mv(out), args = kj::mv(args), env = kj::mv(env), deadline,
                       attempt]() mutable -> kj::Promise<CommandOutput> {
                  if (stopping || host == nullptr) return kj::mv(out);
                  return sbatch(kj::mv(args), kj::mv(env), deadline, attempt + 1);
                });
          }
        }
        return kj::mv(out);
      });
}

void SlurmJob::follow(const SlurmJobInfo& info) {
  slurmId_ = info.id;
  restarts = info.restarts;
  std::ifstream token(settings.logDirectory + "/job-token");
  std::stringstream text;
  text << token.rdbuf();
  jobCredential = text.str();
  if (!jobCredential.empty()) jobTokenFile = settings.logDirectory + "/job-token";
  settings.logger->info("slurm launcher: following job {} (Slurm job {}, submitted earlier){}",
                        request_.name, slurmId_,
                        jobCredential.empty() ? "; its credential file is gone, so its end "
                                                "cannot be reported to the resolver"
                                              : "");
  observe(info);
}

void SlurmJob::submitted(uint64_t id) {
  slurmId_ = id;
  settings.logger->info("slurm launcher: job {} submitted as Slurm job {} ({} tasks)",
                        request_.name, id, request_.replicaCount());
  setPhase(JobPhase::PENDING, "Slurm job " + std::to_string(id) + ": waiting to be scheduled");
  KJ_IF_MAYBE(h, host) {
    h->wake();
  }
  if (stopping) tasks->add(cancel(false));  // terminated while sbatch ran
}

bool SlurmJob::observe(const SlurmJobInfo& info) {
  if (isFinal(phase_)) return false;
  auto before = std::make_pair(phase_, reason_);
  restarts = std::max(restarts, info.restarts);
  if (slurmStateIsFinal(info.state)) {
    if (handledEnd != info.restarts) endedInSlurm(info);
  } else if (slurmRunning(info.state)) {
    setPhase(JobPhase::RUNNING, stopping ? "stopping: " + stopReason : std::string());
  } else if (handledEnd == info.restarts) {
    // Still the ended run Slurm has not requeued yet.
  } else if (pendingReasonIsFinal(info.reason)) {
    tasks->add(cancel(false));
    finish(JobPhase::UNSCHEDULABLE, "Slurm job " + std::to_string(slurmId_) + ": " + info.reason +
                                        " (it can never run as asked)");
  } else {
    auto why = info.reason.empty() || info.reason == "None" ? std::string("waiting to be scheduled")
                                                            : info.reason;
    setPhase(JobPhase::PENDING, std::string(restarts > 0 ? "restarting; " : "") + "Slurm job " +
                                    std::to_string(slurmId_) + ": " + why);
  }
  return before != std::make_pair(phase_, reason_);
}

void SlurmJob::requeue(std::string why) {
  setPhase(JobPhase::PENDING, why);
  // Slurm holds a requeued job for two minutes (its eligible time); it may start at once.
  auto id = std::to_string(slurmId_);
  std::vector<std::string> requeue{"scontrol", "requeue", id};
  std::vector<std::string> now{"scontrol", "update", "JobId=" + id, "StartTime=now"};
  auto& h = KJ_ASSERT_NONNULL(host);
  tasks->add(h.run(requeue).then([this, &h, requeue, now, why](CommandOutput out) {
    // Slurm may have requeued a preempted job itself ("pending" already): that is as asked.
    if (!out.status.ok() && out.text.find("pending") == std::string::npos) {
      finish(JobPhase::FAILED,
             why + "; and it could not be requeued: " + describeFailure(requeue, out));
      return kj::Promise<void>(kj::READY_NOW);
    }
    return h.run(now).then([this, now](CommandOutput out) {
      if (!out.status.ok()) {
        settings.logger->warn("slurm launcher: job {}: {}", request_.name,
                              describeFailure(now, out));
      }
      KJ_IF_MAYBE(h, host) {
        h->wake();
      }
    });
  }));
}

void SlurmJob::endedInSlurm(const SlurmJobInfo& info) {
  handledEnd = info.restarts;
  kj::StringPtr state = info.state;
  if (stopping) {
    finish(JobPhase::STOPPED, stopReason);
  } else if (state == "COMPLETED") {
    finish(JobPhase::SUCCEEDED, "");
  } else if (state == "CANCELLED") {
    finish(JobPhase::STOPPED, "cancelled in Slurm (scancel, or an administrator)");
  } else if (state == "PREEMPTED" && request_.resources.preemptible) {
    // Not a failure: a preemptible job is run again, however often it is preempted.
    settings.logger->info("slurm launcher: job {}: preempted; requeued", request_.name);
    requeue("preempted; waiting to run again");
  } else {
    std::string why = state == "TIMEOUT" ? std::string("it reached its time limit") : failedTask();
    if (why.empty()) {
      why = "Slurm job " + std::to_string(slurmId_) + " ended " + info.state + " (exit code " +
            std::to_string(info.exitCode) + ":" + std::to_string(info.exitSignal) + ")";
    }
    if (failures < request_.maxRetriesFailure && state != "TIMEOUT") {
      ++failures;
      settings.logger->warn("slurm launcher: job {}: {}; requeued (restart {} of at most {})",
                            request_.name, why, failures, request_.maxRetriesFailure);
      requeue("restarting after: " + why);
      return;
    }
    finish(JobPhase::FAILED, why);
  }
}

std::string SlurmJob::failedTask() const {
  // srun logs "srun: error: <node>: task <n>: Exited with exit code <c>" (or "Killed", ...)
  // for each task that failed; the first of the last run is the one that ended it.
  std::ifstream in(settings.logDirectory + "/batch.log");
  std::string line, found;
  while (std::getline(in, line)) {
    auto at = line.find(": task ");
    if (line.rfind("srun: error: ", 0) != 0 || at == std::string::npos) continue;
    if (line.find("Terminated") != std::string::npos && !found.empty()) continue;
    found = line.substr(at + 2);  // "task 1: Exited with exit code 3"
  }
  return found;
}

void SlurmJob::vanished() {
  if (isFinal(phase_)) return;
  if (stopping) {
    finish(JobPhase::STOPPED, stopReason);
  } else {
    finish(JobPhase::FAILED, "Slurm no longer knows job " + std::to_string(slurmId_) +
                                 " (it ended longer ago than MinJobAge, or was purged)");
  }
}

void SlurmJob::finish(JobPhase phase, std::string why) {
  if (isFinal(phase_)) return;
  phase_ = phase;
  reason_ = why;
  if (!jobTokenFile.empty()) ::unlink(jobTokenFile.c_str());
  auto level = phase == JobPhase::SUCCEEDED || phase == JobPhase::STOPPED ? spdlog::level::info
                                                                          : spdlog::level::warn;
  settings.logger->log(level, "slurm launcher: job {} {}{}{}", request_.name,
                       toString(phase).cStr(), why.empty() ? "" : ": ", why);
  changeSignal.notify();
  KJ_IF_MAYBE(h, host) {
    if (!jobCredential.empty()) {
      JobStatus status{request_.name, JobState::ENDED, endedReason(phase, why)};
      tasks->add(h->resolver()
                     .setJobStatus(status, jobCredential)
                     .catch_([this](kj::Exception&& e) {
                       settings.logger->warn("slurm launcher: could not report job {} ended: {}",
                                             request_.name, e.getDescription().cStr());
                     })
                     .then([this]() { endFulfiller->fulfill(); }));
      return;
    }
  }
  endFulfiller->fulfill();
}

kj::Promise<void> SlurmJob::whenFinal() { return KJ_ASSERT_NONNULL(endReported).addBranch(); }

kj::Promise<void> SlurmJob::cancel(bool graceful) {
  KJ_IF_MAYBE(h, host) {
    std::vector<std::string> args{"scancel"};
    if (graceful) args.push_back("--signal=TERM");
    args.push_back(std::to_string(slurmId_));
    h->wake();
    return h->run(args).then([this, args](CommandOutput out) {
      if (!out.status.ok()) {
        settings.logger->warn("slurm launcher: job {}: {}", request_.name,
                              describeFailure(args, out));
      }
    });
  }
  return kj::READY_NOW;
}

kj::Promise<void> SlurmJob::terminate(kj::Maybe<kj::Duration> grace) {
  if (isFinal(phase_) || stopping) return whenFinal();
  stopping = true;
  stopReason = "terminated";
  stopFulfiller->fulfill();
  if (slurmId_ == 0) return whenFinal();  // sbatch has not answered: cancelled once it does
  if (phase_ == JobPhase::PENDING) {
    tasks->add(cancel(false));
  } else {
    setPhase(JobPhase::RUNNING, "stopping: " + stopReason);
    kj::Duration wait = settings.terminateGrace;
    KJ_IF_MAYBE(g, grace) {
      wait = *g;
    }
    tasks->add(cancel(true));
    tasks->add(loop.timer().afterDelay(wait).then([this]() -> kj::Promise<void> {
      if (isFinal(phase_)) return kj::READY_NOW;
      settings.logger->warn("slurm launcher: job {} still runs after its grace; cancelling it",
                            request_.name);
      return cancel(false);
    }));
  }
  return whenFinal();
}

void SlurmJob::detach() {
  host = nullptr;
  controlOffer = nullptr;
  // Cancels the commands and the report in flight: they use the host.
  tasks = kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this));
  if (!isFinal(phase_)) {
    reason_ = "the launcher was destroyed; the job runs on in Slurm";
    changeSignal.notify();
  }
  if (endFulfiller->isWaiting()) {
    endFulfiller->reject(makeError(ErrorCode::FAILED, kj::str("job ", request_.name, ": ",
                                                              "the launcher was destroyed")));
  }
}

}  // namespace troupe::jobs_detail
