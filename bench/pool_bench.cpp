// Pools: a call through ActorPool against a bare ActorRef, broadcast to 4, 16 and 64 members
// against the slowest single call, and waitReady(32) after the 32nd registration. Beside the
// broadcast, in the same run, what the same fan-out costs with plain Cap'n Proto (one
// TwoPartyClient per member, the calls joined) and with no RPC at all (a 64 B write to each of N
// TCP connections, then each reply read: the floor).
//
// The members are echo actors hosted by one server process (bench_echo_server --count 64, one
// loop, one port per member), listed in a FixedResolver. Pinned to CPU 0 by default, like
// call_bench; TROUPE_BENCH_PIN=free leaves placement to the scheduler.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <kj/async-io.h>

#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "troupe/resolver/open_resolver.h"
#include "bench_echo.capnp.h"
#include "bench/bench_peers.h"
#include "bench/bench_sockets.h"
#include "bench/bench_support.h"
#include "tests/support/child_process.h"

namespace {

using troupe::bench::BenchEcho;
using Clock = std::chrono::steady_clock;

constexpr unsigned MEMBERS = 64;
std::vector<std::string> addresses;  // tcp://127.0.0.1:port of member i
std::string registryUrl;             // the troupe-registry daemon
pid_t serverPid = 0;                 // the members' server process
std::string capnpAddress;            // host:port of a plain Cap'n Proto echo server
pid_t capnpPid = 0;
std::string rawAddress;  // host:port of a bare TCP echo server
pid_t rawPid = 0;

double micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count() / 1e3;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// A resolver listing members 0..n-1 as "<job>/echo-<i>".
kj::Own<troupe::FixedResolver> resolverFor(kj::StringPtr job, unsigned n) {
  auto resolver = kj::heap<troupe::FixedResolver>();
  for (unsigned i = 0; i < n; ++i) {
    troupe::Endpoint e;
    e.name = kj::str(job, "/echo-", i).cStr();
    e.address = addresses[i];
    e.state = troupe::EndpointState::READY;
    resolver->add(e);
  }
  return resolver;
}

auto echo64 = [](BenchEcho::Client c) {
  static const kj::byte payload[64] = {1, 2, 3};
  auto q = c.echoRequest(capnp::MessageSize{16, 0});
  q.setPayload(kj::arrayPtr(payload, sizeof(payload)));
  return q.send();
};

void report(benchmark::State& state, std::vector<double>& samples) {
  troupe::bench::reportPercentiles(state, samples);
}

// Client and server CPU per member over the timed iterations, from the CPU clocks read before.
void reportCpu(benchmark::State& state, unsigned n, double clientCpu, double serverCpu,
               pid_t server) {
  clientCpu = troupe::bench::cpuSeconds() - clientCpu;
  serverCpu = troupe::bench::cpuSeconds(server) - serverCpu;
  double perMember = 1e6 / (double(state.iterations()) * n);
  state.counters["client_cpu_per_member_us"] = clientCpu * perMember;
  state.counters["server_cpu_per_member_us"] = serverCpu * perMember;
}

void BM_ActorRef_Call(benchmark::State& state) {
  troupe::EventLoop loop;
  auto ref = troupe::ActorRef<BenchEcho>::connect(loop, addresses[0].c_str(), "echo");
  for (int i = 0; i < 200; ++i) ref.call(echo64).wait(loop.waitScope());
  std::vector<double> samples;
  for (auto _ : state) {
    auto start = Clock::now();
    ref.call(echo64).wait(loop.waitScope());
    samples.push_back(micros(Clock::now() - start));
  }
  report(state, samples);
}

void poolCall(benchmark::State& state, troupe::ActorPoolOptions options) {
  troupe::EventLoop loop;
  auto resolver = resolverFor("one", 1);
  troupe::ActorGroup<BenchEcho> group(loop, *resolver, "one", "echo");
  group.waitReady(1, 10 * kj::SECONDS).wait(loop.waitScope());
  troupe::ActorPool<BenchEcho> pool(group, options);
  for (int i = 0; i < 200; ++i) pool.call(echo64).wait(loop.waitScope());
  std::vector<double> samples;
  for (auto _ : state) {
    auto start = Clock::now();
    pool.call(echo64).wait(loop.waitScope());
    samples.push_back(micros(Clock::now() - start));
  }
  report(state, samples);
}

void BM_Pool_Call(benchmark::State& state) { poolCall(state, {}); }

// The same without the liveness probe each attempt carries (ActorPoolOptions::probeAfter).
void BM_Pool_Call_NoProbe(benchmark::State& state) {
  poolCall(state, {.probeAfter = 0 * kj::SECONDS});
}

// Broadcast to N members; also reports the slowest member's single-call p50, measured first.
void BM_Broadcast(benchmark::State& state) {
  unsigned n = static_cast<unsigned>(state.range(0));
  troupe::EventLoop loop;
  auto& ws = loop.waitScope();
  auto resolver = resolverFor("many", n);
  troupe::ActorGroup<BenchEcho> group(loop, *resolver, "many", "echo");
  group.waitReady(n, 10 * kj::SECONDS).wait(ws);
  troupe::ActorPool<BenchEcho> pool(group);

  double slowest = 0;
  for (auto& member : group.readyMembers()) {
    auto ref = troupe::ActorRef<BenchEcho>(member->ref);
    std::vector<double> single;
    for (int i = 0; i < 300; ++i) {
      auto start = Clock::now();
      ref.call(echo64).wait(ws);
      if (i >= 50) single.push_back(micros(Clock::now() - start));
    }
    slowest = std::max(slowest, percentile(single, 0.5));
  }
  for (int i = 0; i < 20; ++i) pool.broadcast(echo64).waitAll(10 * kj::SECONDS).wait(ws);

  std::vector<double> samples;
  double clientCpu = troupe::bench::cpuSeconds(), serverCpu = troupe::bench::cpuSeconds(serverPid);
  for (auto _ : state) {
    auto start = Clock::now();
    auto results = pool.broadcast(echo64).waitAll(10 * kj::SECONDS).wait(ws);
    samples.push_back(micros(Clock::now() - start));
    for (auto& r : results) {
      if (!r.ok()) state.SkipWithError("a member failed");
    }
  }
  // Where a member's share goes: CPU time per member per broadcast, in the client (sending the
  // request, reading the reply, the pool's bookkeeping) and in the members' server process.
  reportCpu(state, n, clientCpu, serverCpu, serverPid);
  report(state, samples);
  state.counters["slowest_single_p50_us"] = slowest;
  state.counters["extra_per_member_us"] = (percentile(samples, 0.5) - slowest) / n;
}

// The same fan-out with plain Cap'n Proto: N connections to one echo server, each call sent at
// once, the N promises joined.
void BM_Broadcast_PlainCapnp(benchmark::State& state) {
  unsigned n = static_cast<unsigned>(state.range(0));
  auto io = kj::setupAsyncIo();
  kj::Vector<kj::Own<troupe::bench::PlainCapnpClient>> members;
  for (unsigned i = 0; i < n; ++i) {
    members.add(kj::heap<troupe::bench::PlainCapnpClient>(io, capnpAddress));
  }
  auto broadcast = [&]() {
    auto calls = KJ_MAP(member, members) {
      return echo64(member->echo).then([](capnp::Response<BenchEcho::EchoResults>&& r) {
        return r.getPayload().size();
      });
    };
    return kj::joinPromises(kj::mv(calls));
  };
  for (int i = 0; i < 20; ++i) broadcast().wait(io.waitScope);
  std::vector<double> samples;
  double clientCpu = troupe::bench::cpuSeconds(), serverCpu = troupe::bench::cpuSeconds(capnpPid);
  for (auto _ : state) {
    auto start = Clock::now();
    auto sizes = broadcast().wait(io.waitScope);
    samples.push_back(micros(Clock::now() - start));
    for (auto size : sizes) {
      if (size != 64) state.SkipWithError("echo size mismatch");
    }
  }
  reportCpu(state, n, clientCpu, serverCpu, capnpPid);
  report(state, samples);
}

// The floor: no RPC, no framing. A 64 B write to each of N TCP connections to a bare echo
// server, then epoll until every connection has its 64 B back.
void BM_Broadcast_RawTcp(benchmark::State& state) {
  unsigned n = static_cast<unsigned>(state.range(0));
  int poll = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<int> fds;
  for (unsigned i = 0; i < n; ++i) {
    int fd = troupe::bench::connectTcp(rawAddress);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct epoll_event event = {};
    event.events = EPOLLIN;
    event.data.u32 = i;
    ::epoll_ctl(poll, EPOLL_CTL_ADD, fd, &event);
    fds.push_back(fd);
  }
  std::vector<size_t> received(n);
  auto broadcast = [&]() {
    static const char payload[64] = {1, 2, 3};
    for (int fd : fds) {
      if (::write(fd, payload, sizeof(payload)) != sizeof(payload)) return false;
    }
    std::fill(received.begin(), received.end(), 0);
    unsigned complete = 0;
    while (complete < n) {
      struct epoll_event ready[256];
      int k = ::epoll_wait(poll, ready, 256, 10000);
      if (k <= 0) return false;
      for (int j = 0; j < k; ++j) {
        auto i = ready[j].data.u32;
        char buffer[256];
        ssize_t got = ::read(fds[i], buffer, sizeof(buffer));
        if (got <= 0) return false;
        received[i] += got;
        if (received[i] == sizeof(payload)) ++complete;
      }
    }
    return true;
  };
  for (int i = 0; i < 20; ++i) broadcast();
  std::vector<double> samples;
  double clientCpu = troupe::bench::cpuSeconds(), serverCpu = troupe::bench::cpuSeconds(rawPid);
  for (auto _ : state) {
    auto start = Clock::now();
    if (!broadcast()) state.SkipWithError("the raw echo failed");
    samples.push_back(micros(Clock::now() - start));
  }
  reportCpu(state, n, clientCpu, serverCpu, rawPid);
  report(state, samples);
  for (int fd : fds) ::close(fd);
  ::close(poll);
}

// waitReady(32) when 31 members are READY: time from the 32nd member's registration to the
// promise resolving (the watch delivering the event, the group noticing, the waiter waking).
void BM_WaitReady32(benchmark::State& state) {
  troupe::EventLoop loop;
  auto& ws = loop.waitScope();
  std::vector<double> samples;
  for (auto _ : state) {
    state.PauseTiming();
    troupe::FixedResolver resolver;
    troupe::ActorGroup<BenchEcho> group(loop, resolver, "ready", "echo");
    for (unsigned i = 0; i < 31; ++i) {
      troupe::Endpoint e;
      e.name = kj::str("ready/echo-", i).cStr();
      e.address = addresses[i];
      e.state = troupe::EndpointState::READY;
      resolver.add(e);
    }
    auto waiting = group.waitReady(32, 10 * kj::SECONDS);
    waiting.poll(ws);
    troupe::Endpoint last;
    last.name = "ready/echo-31";
    last.address = addresses[31];
    last.state = troupe::EndpointState::READY;
    state.ResumeTiming();
    auto start = Clock::now();
    resolver.add(last);
    waiting.wait(ws);
    samples.push_back(micros(Clock::now() - start));
  }
  report(state, samples);
}

// The same over the registry daemon: 31 endpoints registered through a RegistryResolver, then
// the time from the 32nd registerEndpoint() to waitReady(32) resolving (a register call to the
// registry, its push to the group's watch, the group waking the waiter).
void BM_WaitReady32_Registry(benchmark::State& state) {
  troupe::EventLoop loop;
  auto& ws = loop.waitScope();
  auto resolver = troupe::openResolver(loop, registryUrl.c_str());
  std::vector<double> samples;
  uint64_t round = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto job = kj::str("ready", round++);
    troupe::ActorGroup<BenchEcho> group(loop, *resolver, job, "echo");
    kj::Vector<kj::Own<troupe::Registration>> registrations;
    auto endpoint = [&](unsigned i) {
      troupe::Endpoint e;
      e.name = kj::str(job, "/echo-", i).cStr();
      e.address = addresses[i];
      e.state = troupe::EndpointState::READY;
      return e;
    };
    for (unsigned i = 0; i < 31; ++i) {
      registrations.add(resolver->registerEndpoint(endpoint(i)));
      registrations.back()->whenRegistered().wait(ws);
    }
    auto waiting = group.waitReady(32, 10 * kj::SECONDS);
    while (group.readyCount() < 31) group.whenChanged().wait(ws);
    state.ResumeTiming();
    auto start = Clock::now();
    registrations.add(resolver->registerEndpoint(endpoint(31)));
    waiting.wait(ws);
    samples.push_back(micros(Clock::now() - start));
  }
  report(state, samples);
}

BENCHMARK(BM_ActorRef_Call)->UseRealTime();
BENCHMARK(BM_Pool_Call)->UseRealTime();
BENCHMARK(BM_Pool_Call_NoProbe)->UseRealTime();
BENCHMARK(BM_Broadcast)->Arg(4)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_Broadcast_PlainCapnp)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_Broadcast_RawTcp)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_WaitReady32)->UseRealTime();
BENCHMARK(BM_WaitReady32_Registry)->UseRealTime()->Iterations(200);

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::choosePlacement();
  troupe::test::ChildProcess server(BENCH_ECHO_SERVER_PATH,
                                    {"--impl", "troupe", "--addr", "127.0.0.1:0", "--count",
                                     std::to_string(MEMBERS)});
  serverPid = server.pid();
  for (unsigned i = 0; i < MEMBERS; ++i) {
    auto line = server.readLine();
    if (line.rfind("LISTENING ", 0) != 0) {
      fprintf(stderr, "echo server did not start: '%s'\n", line.c_str());
      return 1;
    }
    addresses.push_back("tcp://" + line.substr(strlen("LISTENING ")));
  }
  troupe::test::ChildProcess registry(TROUPE_REGISTRY_PATH,
                                      {"--listen", "tcp://127.0.0.1:0", "--log-level", "warn"});
  auto line = registry.readLine();
  if (line.rfind("LISTENING ", 0) != 0) {
    fprintf(stderr, "troupe-registry did not start: '%s'\n", line.c_str());
    return 1;
  }
  registryUrl = "registry://" + line.substr(strlen("LISTENING tcp://"));
  std::unique_ptr<troupe::test::ChildProcess> capnpServer, rawServer;
  capnpAddress = troupe::bench::startEchoServer(capnpServer, {"--impl", "capnp"});
  capnpPid = capnpServer->pid();
  rawAddress = troupe::bench::startEchoServer(rawServer, {"--impl", "raw"});
  rawPid = rawServer->pid();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
