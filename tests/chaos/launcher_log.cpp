#include "tests/chaos/launcher_log.h"

#include <stdio.h>

#include <utility>

namespace troupe::chaos {

namespace {

// Lines kept for tail().
constexpr size_t TAIL_LINES = 200;

}  // namespace

void LauncherLog::markShutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  shuttingDown = true;
}

std::vector<ReplicaExit> LauncherLog::exits() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ended;
}

size_t LauncherLog::starts() {
  std::lock_guard<std::mutex> lock(mutex_);
  return started;
}

std::vector<std::string> LauncherLog::tail() {
  std::lock_guard<std::mutex> lock(mutex_);
  return {lines.begin(), lines.end()};
}

void LauncherLog::sink_it_(const spdlog::details::log_msg& msg) {
  std::string line(msg.payload.data(), msg.payload.size());
  parse(line);
  lines.push_back(std::move(line));
  if (lines.size() > TAIL_LINES) lines.pop_front();
}

// "job chaos: replica 2 started (pid 4321, start 3)" or
// "job chaos: replica 2 (pid 4321) was killed by signal 9 (SIGKILL)[; starting it again ...]".
void LauncherLog::parse(const std::string& line) {
  if (line.rfind(prefix, 0) != 0) return;
  const char* rest = line.c_str() + prefix.size();
  unsigned index = 0;
  int pid = 0;
  int used = 0;
  if (sscanf(rest, "%u started (pid %d", &index, &pid) == 2) {
    ++started;
    return;
  }
  if (sscanf(rest, "%u (pid %d) %n", &index, &pid, &used) != 2 || used == 0) return;
  if (endedByPid.count(pid) > 0) return;
  std::string how = rest + used;
  how = how.substr(0, how.find(';'));
  endedByPid[pid] = ended.size();
  ended.push_back({index, static_cast<pid_t>(pid), std::move(how), shuttingDown});
}

std::shared_ptr<spdlog::logger> loggerFor(std::shared_ptr<LauncherLog> sink) {
  auto logger = std::make_shared<spdlog::logger>("launcher", std::move(sink));
  logger->set_level(spdlog::level::trace);
  return logger;
}

}  // namespace troupe::chaos
