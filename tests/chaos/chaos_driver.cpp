#include "tests/chaos/chaos_driver.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include <kj/debug.h>

#include "troupe/jobs/launcher.h"

namespace troupe::chaos {

namespace {

// "exited with status 0", "was killed by SIGKILL", for a wait status.
std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by SIG") + sigabbrev_np(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

}  // namespace

void ChaosDriver::ErrorHandler::taskFailed(kj::Exception&& exception) {
  problems.push_back(exception.getDescription().cStr());
}

ChaosDriver::ChaosDriver(EventLoop& loop, Random& random, JobHandle job, RegistryDaemon& registry,
                         ChaosDriverOptions options)
    : loop(loop),
      random(random),
      job(kj::mv(job)),
      registry(registry),
      options(kj::mv(options)),
      started(loop.timer().now()) {}

ChaosDriver::~ChaosDriver() noexcept(false) { thawAll(); }

kj::Promise<void> ChaosDriver::run(kj::TimePoint until) {
  started = loop.timer().now();
  return step(until).then([this]() {
    thawAll();
    return whenRestarted();
  });
}

kj::Promise<void> ChaosDriver::step(kj::TimePoint until) {
  return loop.timer().afterDelay(between(options.minGap, options.maxGap)).then([this, until]() {
    if (loop.timer().now() >= until) return kj::Promise<void>(kj::READY_NOW);
    act();
    return step(until);
  });
}

void ChaosDriver::act() {
  auto roll = random.below(100);
  if (roll < options.killPercent) {
    kill();
  } else if (roll < options.killPercent + options.freezePercent) {
    if (frozen.size() < options.maxFrozen) {
      freeze();
    } else {
      kill();
    }
  } else if (!restartUnderWay) {
    restartRegistry();
  } else {
    kill();
  }
}

void ChaosDriver::kill() {
  KJ_IF_MAYBE(target, pick(false)) {
    auto& [index, process] = *target;
    if (process.signal(SIGKILL)) {
      ++counts_.kills;
      killedPids.insert(process.pid());
      frozen.erase(process.pid());
      note("SIGKILL replica " + std::to_string(index) + " (pid " + std::to_string(process.pid()) +
           ")");
      return;
    }
  }
  ++counts_.skipped;
}

void ChaosDriver::freeze() {
  KJ_IF_MAYBE(target, pick(true)) {
    auto& [index, process] = *target;
    if (process.signal(SIGSTOP)) {
      ++counts_.freezes;
      pid_t pid = process.pid();
      auto span = between(options.minFreeze, options.maxFreeze);
      note("SIGSTOP replica " + std::to_string(index) + " (pid " + std::to_string(pid) + ") for " +
           std::to_string(span / kj::MILLISECONDS) + " ms");
      frozen.emplace(pid, kj::mv(process));
      tasks.add(loop.timer().afterDelay(span).then([this, pid]() { thaw(pid); }));
      return;
    }
  }
  ++counts_.skipped;
}

void ChaosDriver::restartRegistry() {
  int signal = random.below(2) == 0 ? SIGTERM : SIGKILL;
  (signal == SIGTERM ? counts_.registryTerms : counts_.registryKills)++;
  note(std::string("restart the registry after SIG") + sigabbrev_np(signal));
  restartUnderWay = true;
  auto restarted = registry.restart(signal).then([this, signal](int status) {
    bool expected = signal == SIGTERM ? WIFEXITED(status) && WEXITSTATUS(status) == 0
                                      : WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (!expected) {
      problems_.push_back(std::string("the registry ") + describeStatus(status) + " after SIG" +
                          sigabbrev_np(signal));
    }
    note("the registry is back");
  });
  tasks.add(restarted.attach(kj::defer([this]() {
    restartUnderWay = false;
    restartEnded.notify();
  })));
}

void ChaosDriver::thaw(pid_t pid) {
  auto it = frozen.find(pid);
  if (it == frozen.end()) return;  // killed, or thawed at the end already
  it->second.signal(SIGCONT);
  note("SIGCONT pid " + std::to_string(pid));
  frozen.erase(it);
}

void ChaosDriver::thawAll() {
  for (auto& [pid, process] : frozen) process.signal(SIGCONT);
  frozen.clear();
}

kj::Promise<void> ChaosDriver::whenRestarted() {
  if (!restartUnderWay) return kj::READY_NOW;
  return restartEnded.next().then([this]() { return whenRestarted(); });
}

kj::Maybe<std::pair<uint32_t, ReplicaProcess>> ChaosDriver::pick(bool awake) {
  std::vector<std::pair<uint32_t, pid_t>> candidates;
  for (auto& r : job.replicas()) {
    if (r.pid == 0 || (awake && frozen.count(r.pid) > 0)) continue;
    candidates.push_back({r.index, r.pid});
  }
  while (!candidates.empty()) {
    size_t i = random.below(candidates.size());
    auto [index, pid] = candidates[i];
    KJ_IF_MAYBE(process, ReplicaProcess::open(pid)) {
      return std::make_pair(index, kj::mv(*process));
    }
    candidates.erase(candidates.begin() + static_cast<ptrdiff_t>(i));  // exited just now
  }
  return nullptr;
}

kj::Duration ChaosDriver::between(kj::Duration low, kj::Duration high) {
  auto span = static_cast<uint64_t>((high - low) / kj::MILLISECONDS) + 1;
  return low + static_cast<int64_t>(random.below(span)) * kj::MILLISECONDS;
}

void ChaosDriver::note(std::string what) {
  char stamp[32];
  snprintf(stamp, sizeof(stamp), "%.3f s: ",
           static_cast<double>((loop.timer().now() - started) / kj::MILLISECONDS) / 1000.0);
  history_.push_back(stamp + what);
}

}  // namespace troupe::chaos
