// The registry's dashboard history (resolver/detail/metrics_history.h): what a round of reads
// costs the registry's loop, and the memory the history holds when full.
//
//   BM_HistoryRound/<endpoints>   one round: each endpoint's totals recorded (the difference
//                                 from its last read, its sample, its job's), then the jobs'
//                                 samples; 10 endpoints per job. Counters: "resident_mib", the
//                                 growth of this process's resident memory from an empty history
//                                 to a full one (every series at its length, 180 samples at the
//                                 defaults), and "bytes_per_series" as memoryBytes() counts it.

#include <malloc.h>

#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "troupe/resolver/detail/metrics_history.h"
#include "tests/support/resident_memory.h"

namespace {

using troupe::resolver_detail::CallTotals;
using troupe::resolver_detail::HistoryOptions;
using troupe::resolver_detail::MetricsHistory;

void BM_HistoryRound(benchmark::State& state) {
  auto endpoints = static_cast<size_t>(state.range(0));
  std::vector<std::string> names, jobs;
  for (size_t i = 0; i < endpoints; ++i) {
    jobs.push_back("job" + std::to_string(i / 10));
    names.push_back(jobs.back() + "/actor-" + std::to_string(i % 10));
  }
  HistoryOptions options;  // 5 s, 15 min: 180 samples per series
  options.maxSeries = endpoints + endpoints / 10 + 1;
  malloc_trim(0);
  auto before = troupe::test::residentBytes();
  MetricsHistory history(options);
  CallTotals totals;
  int64_t now = 0;
  auto round = [&]() {
    now += 5000;
    history.beginRound(now);
    totals.outcomes.ok += 100;
    totals.outcomes.errors[1] += 1;
    totals.latency.record(1 * kj::MILLISECONDS);
    for (size_t i = 0; i < endpoints; ++i) history.add(names[i], jobs[i], totals);
    history.endRound();
  };
  for (int i = 0; i < 181; ++i) round();  // full
  auto full = troupe::test::residentBytes();
  for (auto _ : state) round();
  state.counters["resident_mib"] = static_cast<double>(full - before) / (1 << 20);
  state.counters["bytes_per_series"] = static_cast<double>(history.memoryBytes()) /
                                       static_cast<double>(history.seriesCount());
  state.counters["series"] = static_cast<double>(history.seriesCount());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(endpoints));
}
BENCHMARK(BM_HistoryRound)->Arg(100)->Arg(1800)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
