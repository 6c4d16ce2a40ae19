// Small-call latency: a 64-byte (and 4 KiB) echo, one call at a time, from this process to a
// server process. troupe's ActorRef against plain Cap'n Proto RPC (kj's own event loop,
// TwoPartyClient / TwoPartyServer), measured in the same run.
//
// Placement: by default the benchmark and both servers are pinned to CPU 0, which measures the
// software cost of a call (on this kind of 2-core VM, waking a process on the other core costs
// 50-100 us and would swamp it). TROUPE_BENCH_PIN=free leaves placement to the scheduler.
//
// Each benchmark reports the mean (Google Benchmark's time), p50 / p99 and this process's CPU
// time per call (client_cpu_us) in counters.

#include <sched.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include "troupe/actor/actor_ref.h"
#include "bench_echo.capnp.h"
#include "bench/bench_peers.h"
#include "bench/bench_support.h"
#include "tests/support/child_process.h"

namespace {

using troupe::bench::BenchEcho;
using Clock = std::chrono::steady_clock;

struct Servers {
  std::unique_ptr<troupe::test::ChildProcess> troupe;
  std::unique_ptr<troupe::test::ChildProcess> capnp;
  std::unique_ptr<troupe::test::ChildProcess> troupeTls;
  std::unique_ptr<troupe::test::ChildProcess> troupeNoMetrics;
  std::unique_ptr<troupe::test::ChildProcess> troupeNoReplies;
  std::string troupeAddress;           // host:port
  std::string troupeNoMetricsAddress;  // a server that counts nothing (ActorServerOptions::metrics)
  std::string troupeNoRepliesAddress;  // a server that keeps no reply (ReplyCacheOptions::enabled)
  std::string capnpAddress;
  std::string troupeTlsAddress;
  std::string troupeUnixPath;  // troupeAddress's server listens here too
  std::shared_ptr<troupe::Credentials> tlsClient;
};
Servers* servers = nullptr;

std::string startServer(std::unique_ptr<troupe::test::ChildProcess>& slot, const char* impl,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"--impl", impl, "--addr", "127.0.0.1:0"};
  args.insert(args.end(), extra.begin(), extra.end());
  slot = std::make_unique<troupe::test::ChildProcess>(BENCH_ECHO_SERVER_PATH, args);
  auto line = slot->readLine();
  if (line.rfind("LISTENING ", 0) != 0) {
    fprintf(stderr, "%s server did not start: '%s'\n", impl, line.c_str());
    exit(1);
  }
  return line.substr(strlen("LISTENING "));
}

// Records per-call latency and reports percentiles when the benchmark ends.
class Latencies {
public:
  explicit Latencies(benchmark::State& state) : state(state) { samples.reserve(1 << 20); }
  ~Latencies() { troupe::bench::reportPercentiles(state, samples); }
  void add(Clock::duration d) {
    samples.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count() / 1e3);
  }

private:
  benchmark::State& state;
  std::vector<double> samples;
};

kj::Array<kj::byte> payloadOf(size_t size) {
  auto data = kj::heapArray<kj::byte>(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<kj::byte>(i * 131 + 7);
  return data;
}

// This process's CPU time (user and system) so far.
Clock::duration cpuTime() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto of = [](const timeval& t) {
    return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec);
  };
  return std::chrono::duration_cast<Clock::duration>(of(usage.ru_utime) + of(usage.ru_stime));
}

// Reports this process's CPU time per call ("client_cpu_us") from construction to destruction.
class ClientCpu {
public:
  explicit ClientCpu(benchmark::State& state) : state(state), start(cpuTime()) {}
  ~ClientCpu() {
    if (state.iterations() == 0) return;
    auto spent = std::chrono::duration<double, std::micro>(cpuTime() - start).count();
    state.counters["client_cpu_us"] = spent / static_cast<double>(state.iterations());
  }

private:
  benchmark::State& state;
  Clock::duration start;
};

// `address` with `credentials` (null: the loop's), one call at a time. Calls are not marked
// idempotent, so they go with an id for the server's reply cache (README, "Errors and retries")
// unless `exactlyOnce` is false. `sharedMemory`: ChannelOptions::sharedMemory.
void troupePingPong(benchmark::State& state, const std::string& address,
                    std::shared_ptr<troupe::Credentials> credentials, bool metrics = true,
                    bool exactlyOnce = true, bool sharedMemory = true) {
  auto payload = payloadOf(state.range(0));
  troupe::EventLoop loop;
  troupe::ActorRefOptions options;
  options.channel.credentials = kj::mv(credentials);
  options.metrics = metrics;
  options.exactlyOnce = exactlyOnce;
  options.channel.sharedMemory = sharedMemory;
  auto echo = troupe::ActorRef<BenchEcho>::connect(loop, address.c_str(), "echo", options);
  auto call = [&]() {
    return echo.call([&](BenchEcho::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{payload.size() / 8 + 4, 0});
      q.setPayload(payload);
      return q.send();
    });
  };
  for (int i = 0; i < 200; ++i) call().wait(loop.waitScope());  // connect and warm up
  Latencies latencies(state);
  ClientCpu cpu(state);
  for (auto _ : state) {
    auto start = Clock::now();
    auto r = call().wait(loop.waitScope());
    latencies.add(Clock::now() - start);
    if (r.getPayload().size() != payload.size()) state.SkipWithError("echo size mismatch");
  }
}

void BM_Troupe_ActorRef_PingPong(benchmark::State& state) {
  troupePingPong(state, "tcp://" + servers->troupeAddress, nullptr);
}

// The same with a handle and a server that count and time nothing: what metrics cost a call.
void BM_Troupe_ActorRef_PingPong_MetricsOff(benchmark::State& state) {
  troupePingPong(state, "tcp://" + servers->troupeNoMetricsAddress, nullptr, false);
}

// The same with calls sent plainly, without an id (ActorRefOptions::exactlyOnce off): what
// running once across broken connections costs a call, the server's reply cache included.
void BM_Troupe_ActorRef_PingPong_ExactlyOnceOff(benchmark::State& state) {
  troupePingPong(state, "tcp://" + servers->troupeAddress, nullptr, true, false);
}

// The same with calls sent with their id to a server that keeps no reply
// (ReplyCacheOptions::enabled off): of what running once costs, the part that is the id and its
// envelope rather than the reply cache.
void BM_Troupe_ActorRef_PingPong_ReplyCacheOff(benchmark::State& state) {
  troupePingPong(state, "tcp://" + servers->troupeNoRepliesAddress, nullptr);
}

// The same over the server's unix socket: what loopback TCP costs against it, for choosing
// between them on one host.
void BM_Troupe_ActorRef_PingPong_Unix(benchmark::State& state) {
  troupePingPong(state, "unix:" + servers->troupeUnixPath, nullptr);
}

// The same with the client's shared memory off (ChannelOptions::sharedMemory): what reading with
// recvmsg() and the control frames cost a small call, which never goes through shared memory.
void BM_Troupe_ActorRef_PingPong_UnixNoShm(benchmark::State& state) {
  troupePingPong(state, "unix:" + servers->troupeUnixPath, nullptr, true, true, false);
}

// The same over tls://: what TLS costs a small call.
void BM_Troupe_ActorRef_PingPong_Tls(benchmark::State& state) {
  troupePingPong(state, "tls://" + servers->troupeTlsAddress, servers->tlsClient);
}

void BM_PlainCapnp_PingPong(benchmark::State& state) {
  auto payload = payloadOf(state.range(0));
  auto io = kj::setupAsyncIo();
  auto colon = servers->capnpAddress.rfind(':');
  auto addr = io.provider->getNetwork()
                  .parseAddress(servers->capnpAddress.substr(0, colon).c_str(),
                                atoi(servers->capnpAddress.c_str() + colon + 1))
                  .wait(io.waitScope);
  auto stream = addr->connect().wait(io.waitScope);
  capnp::TwoPartyClient client(*stream);
  auto echo = client.bootstrap().castAs<BenchEcho>();
  echo.whenResolved().wait(io.waitScope);
  auto call = [&]() {
    auto q = echo.echoRequest(capnp::MessageSize{payload.size() / 8 + 4, 0});
    q.setPayload(payload);
    return q.send();
  };
  for (int i = 0; i < 200; ++i) call().wait(io.waitScope);
  Latencies latencies(state);
  ClientCpu cpu(state);
  for (auto _ : state) {
    auto start = Clock::now();
    auto r = call().wait(io.waitScope);
    latencies.add(Clock::now() - start);
    if (r.getPayload().size() != payload.size()) state.SkipWithError("echo size mismatch");
  }
}

BENCHMARK(BM_PlainCapnp_PingPong)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong_MetricsOff)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong_ExactlyOnceOff)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong_ReplyCacheOff)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong_Unix)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong_UnixNoShm)->Arg(64)->Arg(4096)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_PingPong_Tls)->Arg(64)->Arg(4096)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::choosePlacement();
  Servers s;
  char socketDir[] = "/tmp/troupe-bench-XXXXXX";
  if (::mkdtemp(socketDir) == nullptr) {
    perror("mkdtemp");
    return 1;
  }
  s.troupeUnixPath = std::string(socketDir) + "/echo.sock";
  s.troupeAddress = startServer(s.troupe, "troupe", {"--unix", s.troupeUnixPath});
  s.capnpAddress = startServer(s.capnp, "capnp");
  s.troupeNoMetricsAddress = startServer(s.troupeNoMetrics, "troupe", {"--metrics", "off"});
  s.troupeNoRepliesAddress = startServer(s.troupeNoReplies, "troupe", {"--replies", "off"});
  troupe::bench::BenchCerts certs;
  s.troupeTlsAddress = startServer(s.troupeTls, "troupe", {"--tls", certs.dir});
  s.tlsClient = certs.client();
  servers = &s;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  servers = nullptr;
  s.troupe.reset();  // stopped, so that its socket is gone
  ::unlink(s.troupeUnixPath.c_str());
  ::rmdir(socketDir);
  return 0;
}
