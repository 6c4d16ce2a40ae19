#pragma once
// What troupe's benchmark programs share: where they run, and their p50 / p99 counters.

#include <sched.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#include <algorithm>
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
  auto at = [&](double p) {
    return micros[std::min(micros.size() - 1, size_t(p * micros.size()))];
  };
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
}

// CPU time (user + system) process `pid` (0: this one) has used so far, in seconds; 0 if the
// process cannot be read.
inline double cpuSeconds(pid_t pid = 0) {
  clockid_t clock;
  if (clock_getcpuclockid(pid, &clock) != 0) return 0;
  struct timespec t;
  if (clock_gettime(clock, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace troupe::bench
