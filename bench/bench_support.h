#pragma once
// What troupe's benchmark programs share: where they run, and their p50 / p99 counters.

#include <sched.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

namespace troupe::bench {

// Pins this process (and the servers it starts afterwards, which inherit it) to CPU 0 unless
// TROUPE_BENCH_PIN=free, and records the placement in the benchmark's context. On a small VM,
// waking a process on the other core costs 50-100 us, so pinning measures the software cost of
// a call; free placement is what an unpinned user sees.
inline void choosePlacement() {
  const char* pin = getenv("TROUPE_BENCH_PIN");
  bool pinned = pin == nullptr || std::string(pin) != "free";
  if (pinned) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  benchmark::AddCustomContext("placement", pinned ? "client and servers pinned to CPU 0"
                                                  : "free (scheduler decides)");
}

// Reports the p50 and p99 of `micros` (per-call latencies in microseconds) as counters.
inline void reportPercentiles(benchmark::State& state, std::vector<double>& micros) {
  if (micros.empty()) return;
  std::sort(micros.begin(), micros.end());
  auto at = [&](double p) { return micros[std::min(micros.size() - 1, size_t(p * micros.size()))]; };
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
}

// CPU time (user + system) process `pid` (0: this one) has used so far, in seconds, from
// /proc/<pid>/stat; tick-granular, so compare it over many calls.
inline double cpuSeconds(pid_t pid = 0) {
  std::string path = pid == 0 ? "/proc/self/stat" : "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start after its closing ')'.
  auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields;
  size_t at = close + 2;
  while (at < text.size() && fields.size() < 13) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    fields.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (fields.size() < 13) return 0;
  // Fields 14 and 15 of the file (utime, stime) are the 12th and 13th after the name.
  double ticks = std::stod(fields[11]) + std::stod(fields[12]);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace troupe::bench
