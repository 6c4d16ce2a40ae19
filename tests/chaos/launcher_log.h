#pragma once
// LauncherLog: what the chaos test's launcher logs, read back for how each replica process
// ended.

#include <sys/types.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

namespace troupe::chaos {

// How one replica process ended, as the launcher reported it.
struct ReplicaExit {
  uint32_t index = 0;
  pid_t pid = 0;
  std::string how;              // "was killed by signal 9 (SIGKILL)", "exited with status 0"
  bool duringShutdown = false;  // it ended after markShutdown()
};

// An spdlog sink for a LocalLauncher's logger (LocalLauncherOptions::logger) that picks out the
// lines of job `job` saying a replica started or ended ("job chaos: replica 2 (pid 4321) was
// killed by signal 9 (SIGKILL)"), and keeps the last lines for a report. The launcher logs on
// its loop's thread; the lock is base_sink's.
class LauncherLog final : public spdlog::sinks::base_sink<std::mutex> {
public:
  explicit LauncherLog(std::string job) : prefix("job " + job + ": replica ") {}

  // Exits from now on count as the shutdown's.
  void markShutdown();

  // Every replica process that ended, in the order they did.
  std::vector<ReplicaExit> exits();

  // How many replica processes the launcher started.
  size_t starts();

  // The last lines logged, oldest first.
  std::vector<std::string> tail();

protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

private:
  void parse(const std::string& line);

  const std::string prefix;
  bool shuttingDown = false;
  size_t started = 0;
  std::vector<ReplicaExit> ended;
  std::map<pid_t, size_t> endedByPid;  // a restart logs the end twice (info, then warn)
  std::deque<std::string> lines;
};

// A logger writing to `sink` at every level.
std::shared_ptr<spdlog::logger> loggerFor(std::shared_ptr<LauncherLog> sink);

}  // namespace troupe::chaos
