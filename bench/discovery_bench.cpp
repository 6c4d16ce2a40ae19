// Discovery at scale, on the registry daemon and on etcd in the same run: one process registers
// N endpoints at once while 20 watchers (each its own resolver client) watch their prefix.
// Reported per run: the time until every watcher has seen every endpoint (seen_all_s), the time
// until every watcher has seen them all go after the registering process is SIGKILLed
// (gone_all_s: the registry notices the dropped connection, etcd waits out the leases' TTL of
// 10 s), and the
// server's resident memory and CPU seconds over the run.
//
//   build/bin/discovery_bench                      # N = 1000 and 5000, registry and etcd
//   build/bin/discovery_bench --benchmark_filter=Etcd/1000

#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <kj/async.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/open_resolver.h"
#include "bench/bench_support.h"
#include "tests/support/child_process.h"
#include "tests/support/etcd_cluster.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t WATCHERS = 20;

// Resident memory of process `pid`, in bytes, from /proc/<pid>/statm.
uint64_t residentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// How long a benchmark waits for the watchers before it gives up (reported as an error).
constexpr auto PATIENCE = std::chrono::seconds(120);

// What one watcher has seen: the names present under its prefix.
struct Seen {
  troupe::Watch* watch;
  std::set<std::string> names;
};

// Runs `loop` until every watcher holds `count` names (or none, for 0); false on PATIENCE.
bool settle(troupe::EventLoop& loop, std::vector<Seen>& seen, size_t count) {
  auto deadline = Clock::now() + PATIENCE;
  for (auto& s : seen) {
    while (s.names.size() != count) {
      if (Clock::now() > deadline) return false;
      auto next = s.watch->next();
      auto timeout = loop.timer().afterDelay(1 * kj::SECONDS).then([]() -> troupe::WatchEvent {
        return troupe::WatchEvent{troupe::WatchEvent::Type::SYNCED, {}, {}};
      });
      auto event = next.exclusiveJoin(kj::mv(timeout)).wait(loop.waitScope());
      if (event.type == troupe::WatchEvent::Type::ADDED) s.names.insert(event.endpoint.name);
      if (event.type == troupe::WatchEvent::Type::REMOVED) s.names.erase(event.endpoint.name);
    }
  }
  return true;
}

void run(benchmark::State& state, bool etcd) {
  size_t n = static_cast<size_t>(state.range(0));
  std::unique_ptr<troupe::test::EtcdCluster> cluster;
  std::unique_ptr<troupe::test::ChildProcess> registry;
  std::string url;
  pid_t server = 0;
  std::string socket = "/tmp/troupe-discovery-bench-" + std::to_string(getpid());
  if (etcd) {
    cluster = std::make_unique<troupe::test::EtcdCluster>(1);
    url = cluster->url();  // leases of the default TTL, 10 s
    server = cluster->pid(0);
  } else {
    registry = std::make_unique<troupe::test::ChildProcess>(
        TROUPE_REGISTRY_PATH,
        std::vector<std::string>{"--listen", "unix:" + socket, "--log-level", "warn"});
    if (registry->readLine().rfind("LISTENING ", 0) != 0) {
      state.SkipWithError("troupe-registry did not start");
      return;
    }
    url = "registry+unix:" + socket;  // leases of the registry's default TTL, 10 s
    server = registry->pid();
  }

  troupe::EventLoop loop;
  troupe::setLoopCredentials(loop, troupe::Credentials::none());
  std::vector<kj::Own<troupe::Resolver>> clients;
  std::vector<kj::Own<troupe::Watch>> watches;
  std::vector<Seen> seen;
  for (size_t i = 0; i < WATCHERS; ++i) {
    clients.push_back(troupe::openResolver(loop, url.c_str()));
    watches.push_back(clients.back()->watch("scale/"));
    seen.push_back(Seen{watches.back().get(), {}});
  }
  if (!settle(loop, seen, 0)) {
    state.SkipWithError("the watchers did not start");
    return;
  }

  double cpuBefore = troupe::bench::cpuSeconds(server);
  uint64_t rssBefore = residentBytes(server);
  for (auto _ : state) {
    auto start = Clock::now();
    troupe::test::ChildProcess registrant(BENCH_REGISTRANT_PATH, {url, std::to_string(n)});
    if (!settle(loop, seen, n)) {
      state.SkipWithError("the watchers did not see every endpoint within 120 s");
      break;
    }
    state.counters["seen_all_s"] = secondsSince(start);
    state.counters["server_rss_MiB"] = static_cast<double>(residentBytes(server)) / (1 << 20);
    state.counters["server_rss_before_MiB"] = static_cast<double>(rssBefore) / (1 << 20);

    auto killed = Clock::now();
    registrant.kill(SIGKILL);
    registrant.wait();
    if (!settle(loop, seen, 0)) {
      state.SkipWithError("the endpoints were not all gone within 120 s");
      break;
    }
    state.counters["gone_all_s"] = secondsSince(killed);
  }
  state.counters["server_cpu_s"] = troupe::bench::cpuSeconds(server) - cpuBefore;
  watches.clear();
  clients.clear();
  if (registry) {
    registry->kill(SIGTERM);
    registry->wait();
  }
}

void BM_Discovery_Registry(benchmark::State& state) { run(state, false); }
void BM_Discovery_Etcd(benchmark::State& state) { run(state, true); }

BENCHMARK(BM_Discovery_Registry)
    ->Arg(1000)
    ->Arg(5000)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();
BENCHMARK(BM_Discovery_Etcd)
    ->Arg(1000)
    ->Arg(5000)
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
