#pragma once
// ChaosDriver: at random moments, SIGKILLs a replica, SIGSTOPs one and SIGCONTs it a while
// later, or restarts the registry.

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include <kj/async.h>

#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/random.h"
#include "troupe/jobs/launcher.h"
#include "tests/chaos/registry_daemon.h"
#include "tests/chaos/replica_process.h"

namespace troupe::chaos {

struct ChaosDriverOptions {
  // The wait before each action, drawn uniformly between these. Defaults 0.5 s and 2.5 s.
  kj::Duration minGap = 500 * kj::MILLISECONDS;
  kj::Duration maxGap = 2500 * kj::MILLISECONDS;

  // How long a frozen replica stays stopped, drawn uniformly between these. Defaults 0.2 s and
  // 6 s: either side of the registry's lease (RegistryDaemon::LEASE_MS, 3 s), so that some
  // frozen replicas are dropped from the group and come back when thawed while others stay, and
  // either side of a call's deadline (3 s), so that calls sent to them run out of time or are
  // answered late.
  kj::Duration minFreeze = 200 * kj::MILLISECONDS;
  kj::Duration maxFreeze = 6 * kj::SECONDS;

  // Most replicas frozen at once; a freeze past it kills instead. Default 2, half the job: some
  // members always answer, or will once they have restarted.
  uint32_t maxFrozen = 2;

  // How the actions are shared, in percent: kills, then freezes; the rest restarts the
  // registry (with SIGTERM or SIGKILL, even odds). Defaults 35 and 35.
  uint32_t killPercent = 35;
  uint32_t freezePercent = 35;
};

struct ChaosCounts {
  uint32_t kills = 0;
  uint32_t freezes = 0;
  uint32_t registryTerms = 0;  // restarts after SIGTERM
  uint32_t registryKills = 0;  // restarts after SIGKILL
  uint32_t skipped = 0;        // actions with no process to act on (all replicas restarting)
};

// Acts on the replicas of `job` (as its launcher reports them) and on `registry`, drawing every
// choice from `random`; signals reach replicas through their pidfds (ReplicaProcess), so only
// processes the test started are ever signalled. Borrows everything; loop thread only.
// Destroying it SIGCONTs every replica it left stopped.
class ChaosDriver {
public:
  ChaosDriver(EventLoop& loop, Random& random, JobHandle job, RegistryDaemon& registry,
              ChaosDriverOptions options = {});
  ~ChaosDriver() noexcept(false);
  KJ_DISALLOW_COPY(ChaosDriver);

  // Acts until `until` on the loop's clock; then thaws every replica still frozen and resolves
  // once a registry restart under way has finished. Call once.
  kj::Promise<void> run(kj::TimePoint until);

  const ChaosCounts& counts() const { return counts_; }

  // Whether this driver SIGKILLed the process `pid`.
  bool killed(pid_t pid) const { return killedPids.count(pid) > 0; }

  // What went wrong on the driver's side ("the registry exited with status 1 after SIGTERM"),
  // one line each; empty when nothing did.
  const std::vector<std::string>& problems() const { return problems_; }

  // What it did, one line per action with its time since run() ("12.345 s: SIGKILL replica 2
  // (pid 4321)"), for a report that lets someone follow a run.
  const std::vector<std::string>& history() const { return history_; }

private:
  class ErrorHandler final : public kj::TaskSet::ErrorHandler {
  public:
    explicit ErrorHandler(std::vector<std::string>& problems) : problems(problems) {}
    void taskFailed(kj::Exception&& exception) override;

  private:
    std::vector<std::string>& problems;
  };

  kj::Promise<void> step(kj::TimePoint until);
  void act();
  void kill();
  void freeze();
  void restartRegistry();
  void thaw(pid_t pid);
  void thawAll();
  kj::Promise<void> whenRestarted();

  // A running replica chosen at random (skipping frozen ones when `awake`), opened for signals.
  kj::Maybe<std::pair<uint32_t, ReplicaProcess>> pick(bool awake);
  kj::Duration between(kj::Duration low, kj::Duration high);
  void note(std::string what);

  EventLoop& loop;
  Random& random;
  JobHandle job;
  RegistryDaemon& registry;
  const ChaosDriverOptions options;
  kj::TimePoint started;
  ChaosCounts counts_;
  std::set<pid_t> killedPids;
  std::map<pid_t, ReplicaProcess> frozen;
  bool restartUnderWay = false;
  ChangeSignal restartEnded;
  std::vector<std::string> problems_;
  std::vector<std::string> history_;
  ErrorHandler errorHandler{problems_};
  kj::TaskSet tasks{errorHandler};  // thaw timers and the registry restart under way
};

}  // namespace troupe::chaos
