// troupe jobs [--watch] [--slurm]: the jobs a resolver knows, whatever launched them, or the
// jobs troupe launchers submitted to Slurm as Slurm reports them.

#include <signal.h>
#include <stdio.h>

#include <algorithm>
#include <string>
#include <vector>

#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"
#include "troupe/jobs/slurm_launcher.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

// How often --watch reads the jobs again when no endpoint changed: a job created without
// endpoints yet, or one that ended elsewhere, shows within this long.
constexpr kj::Duration WATCH_REFRESH = 2 * kj::SECONDS;

// Running jobs first, by name; then ended ones, the last to end first.
void sortForPeople(kj::Array<JobInfo>& jobs) {
  std::sort(jobs.begin(), jobs.end(), [](const JobInfo& a, const JobInfo& b) {
    bool aRuns = a.status.state == JobState::RUNNING;
    bool bRuns = b.status.state == JobState::RUNNING;
    if (aRuns != bRuns) return aRuns;
    if (!aRuns && a.endedAtMillis != b.endedAtMillis) return a.endedAtMillis > b.endedAtMillis;
    return a.status.jobId < b.status.jobId;
  });
}

std::string millisAge(int64_t millis, kj::Date now) {
  return millis > 0 ? formatAge(static_cast<uint64_t>(millis), now) : "-";
}

// Why the job ended, less the state it starts with (STATE shows it): "replica 2 exited with
// status 1" for "failed: replica 2 exited with status 1"; "-" for none.
std::string reasonText(const JobStatus& status) {
  kj::StringPtr outcome = jobOutcome(status);
  const std::string& reason = status.reason;
  if (reason == outcome.cStr()) return "-";
  if (reason.size() > outcome.size() + 2 &&
      reason.compare(0, outcome.size(), outcome.cStr()) == 0 &&
      reason.compare(outcome.size(), 2, ": ") == 0) {
    return reason.substr(outcome.size() + 2);
  }
  return reason.empty() ? "-" : reason;
}

std::vector<std::vector<std::string>> jobRows(kj::Array<JobInfo>& jobs, kj::Date now) {
  sortForPeople(jobs);
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"NAME", "STATE", "READY", "LAUNCHER", "AGE", "ENDED", "REASON"});
  for (auto& j : jobs) {
    bool running = j.status.state == JobState::RUNNING;
    std::string wanted = j.replicas > 0 ? std::to_string(j.replicas) : "-";
    rows.push_back({j.status.jobId, jobOutcome(j.status).cStr(),
                    std::to_string(j.ready) + "/" + wanted, j.launcher.empty() ? "-" : j.launcher,
                    millisAge(j.createdAtMillis, now),
                    running ? "-" : millisAge(j.endedAtMillis, now), reasonText(j.status)});
  }
  return rows;
}

void printSlurmJobs() {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"NAME", "SLURM_ID", "STATE", "REPLICAS", "RESTARTS", "REASON"});
  for (auto& job : listSlurmJobs()) {
    rows.push_back({job.name, std::to_string(job.slurmId), job.state, std::to_string(job.tasks),
                    std::to_string(job.restarts), job.reason.empty() ? "-" : job.reason});
  }
  printRows(rows, true, "(no troupe jobs in Slurm's queue)");
}

class JobsCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Lists the jobs the resolver knows, whatever launched them: running ones first, "
                "then ended ones, the last to end first. For each: its name, its state (running, "
                "succeeded, failed, stopped, unschedulable, or ended), its replicas ready of "
                "those its launcher runs, the launcher (local, slurm, or - for replicas started "
                "by hand), how long ago it was created and ended, and why it ended. On a "
                "terminal the columns are aligned under a header; elsewhere each job is one line "
                "of space-separated fields, the reason last.")
                .addOption(
                    {"watch"},
                    [this]() {
                      watching = true;
                      return true;
                    },
                    "Print the list again whenever it changes, until interrupted (on a terminal, "
                    "in place).")
                .addOption(
                    {"slurm"},
                    [this]() {
                      slurm = true;
                      return true;
                    },
                    "List instead the jobs troupe launchers submitted to Slurm (yours, with the "
                    "comment \"troupe\") that Slurm still knows, newest first, as Slurm reports "
                    "them: Slurm job id, Slurm's state, replicas, restarts and Slurm's reason.")
                .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                  "registry://HOST:PORT, registry+unix:PATH, etcd://HOST:PORT, "
                                  "etcds://HOST:PORT, etcd+unix:PATH, fixed:..., file:PATH "
                                  "(default: $TROUPE_RESOLVER)."))
        .build();
  }

  int run() override {
    if (slurm) {
      if (watching) throw UsageError{"--watch is for the resolver's jobs, not with --slurm"};
      printSlurmJobs();
      return 0;
    }
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    auto& opened = command.resolver(resolver);
    if (!watching) {
      auto jobs = opened.jobs().wait(loop.waitScope());
      printRows(jobRows(jobs, loop.calendarNow()), true, "(no jobs)");
      return 0;
    }
    auto watch = opened.watch("");
    auto stopped = loop.onSignal({SIGINT, SIGTERM}).ignoreResult();
    auto follow = drainInto(*watch).exclusiveJoin(showChanges(loop, opened));
    follow.exclusiveJoin(kj::mv(stopped)).wait(loop.waitScope());
    return 0;
  }

private:
  // Wakes the printer at every endpoint change.
  kj::Promise<void> drainInto(Watch& watch) {
    return watch.next().then([this, &watch](WatchEvent) {
      changed.notify();
      return drainInto(watch);
    });
  }

  // Prints the list, then reads it again after each endpoint change or WATCH_REFRESH, and
  // prints it again if it differs (on a terminal, always).
  kj::Promise<void> showChanges(EventLoop& loop, Resolver& opened) {
    return opened.jobs()
        .then([this, &loop](kj::Array<JobInfo> jobs) {
          auto rows = jobRows(jobs, loop.calendarNow());
          // AGE moves every second; a change is one in what the jobs are, not in how old.
          std::vector<std::vector<std::string>> what;
          for (auto& row : rows) what.push_back({row[0], row[1], row[2], row[3], row[6]});
          // A terminal is redrawn each time, for the ages; other output gets the changes only.
          bool terminal = stdoutIsTerminal();
          if (terminal || what != shown) {
            if (terminal) {
              printf("\x1b[H\x1b[2J");  // home, clear
            } else if (!shown.empty()) {
              printf("\n");
            }
            printRows(rows, true, "(no jobs)");
            fflush(stdout);
            shown = kj::mv(what);
          }
          return changed.next().exclusiveJoin(loop.timer().afterDelay(WATCH_REFRESH));
        })
        .then([this, &loop, &opened]() { return showChanges(loop, opened); });
  }

  bool watching = false;
  bool slurm = false;
  std::string resolver;
  CredentialFlags credentialFlags;
  ChangeSignal changed;
  std::vector<std::vector<std::string>> shown;
};

}  // namespace

kj::Own<Command> jobsCommand() { return kj::heap<JobsCommand>(); }

}  // namespace troupe::cli
