// Throughput: K calls in flight on one connection, 64-byte echo. K call chains each send their
// next call when the previous one returns, until a round of 4096 calls is done; items_per_second
// is calls per second. troupe's ActorRef and ActorPool (over a one-member group) against plain
// Cap'n Proto RPC (kj's own event loop, TwoPartyClient-style connection), in the same run.
//
// K = 1 is the one-at-a-time reference; 32 and 64 show what pipelining buys. Pinned to CPU 0
// by default (TROUPE_BENCH_PIN=free leaves placement to the scheduler), like call_bench.

#include <cstdint>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>
#include <kj/async-io.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "bench_echo.capnp.h"
#include "bench/bench_peers.h"
#include "bench/bench_support.h"
#include "bench/in_flight.h"

namespace {

using troupe::bench::BenchEcho;

constexpr size_t PAYLOAD_BYTES = 64;

std::string troupeAddress;           // tcp://host:port
std::string troupeNoMetricsAddress;  // tcp://host:port of a server that counts nothing
std::string capnpAddress;            // host:port

void BM_PlainCapnp_InFlight(benchmark::State& state) {
  auto payload = troupe::bench::payloadOf(PAYLOAD_BYTES);
  auto io = kj::setupAsyncIo();
  troupe::bench::PlainCapnpClient client(io, capnpAddress);
  auto send = [&]() {
    auto q = client.echo.echoRequest(capnp::MessageSize{PAYLOAD_BYTES / 8 + 4, 0});
    q.setPayload(payload);
    return q.send();
  };
  troupe::bench::runRounds(state, io.waitScope, send, PAYLOAD_BYTES);
}

// `address`'s echo through an ActorRef, `state.range(0)` calls in flight.
void troupeRefInFlight(benchmark::State& state, const std::string& address, bool metrics = true) {
  auto payload = troupe::bench::payloadOf(PAYLOAD_BYTES);
  troupe::EventLoop loop;
  auto echo = troupe::ActorRef<BenchEcho>::connect(loop, address.c_str(), "echo",
                                                   {.metrics = metrics});
  auto send = [&]() {
    return echo.call([&](BenchEcho::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{PAYLOAD_BYTES / 8 + 4, 0});
      q.setPayload(payload);
      return q.send();
    });
  };
  troupe::bench::runRounds(state, loop.waitScope(), send, PAYLOAD_BYTES);
}

void BM_Troupe_ActorRef_InFlight(benchmark::State& state) {
  troupeRefInFlight(state, troupeAddress);
}

// A handle and a server that count and time nothing (ActorRefOptions and
// ActorServerOptions::metrics).
void BM_Troupe_ActorRef_InFlight_MetricsOff(benchmark::State& state) {
  troupeRefInFlight(state, troupeNoMetricsAddress, false);
}

// Through a pool over a one-member group at `address`; `metrics` for the pool
// (ActorPoolOptions::metrics).
void troupePoolInFlight(benchmark::State& state, const std::string& address, bool metrics) {
  auto payload = troupe::bench::payloadOf(PAYLOAD_BYTES);
  troupe::EventLoop loop;
  troupe::FixedResolver resolver;
  troupe::Endpoint member;
  member.name = "one/echo-0";
  member.address = address;
  member.state = troupe::EndpointState::READY;
  resolver.add(member);
  troupe::ActorGroup<BenchEcho> group(loop, resolver, "one", "echo");
  group.waitReady(1, 10 * kj::SECONDS).wait(loop.waitScope());
  troupe::ActorPool<BenchEcho> pool(group, {.metrics = metrics});
  auto send = [&]() {
    return pool.call([&](BenchEcho::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{PAYLOAD_BYTES / 8 + 4, 0});
      q.setPayload(payload);
      return q.send();
    });
  };
  troupe::bench::runRounds(state, loop.waitScope(), send, PAYLOAD_BYTES);
}

void BM_Troupe_Pool_InFlight(benchmark::State& state) {
  troupePoolInFlight(state, troupeAddress, true);
}

// Pool and server both without metrics: what they cost the whole call.
void BM_Troupe_Pool_InFlight_MetricsOff(benchmark::State& state) {
  troupePoolInFlight(state, troupeNoMetricsAddress, false);
}

BENCHMARK(BM_PlainCapnp_InFlight)->Arg(1)->Arg(32)->Arg(64)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_InFlight)->Arg(1)->Arg(32)->Arg(64)->UseRealTime();
BENCHMARK(BM_Troupe_ActorRef_InFlight_MetricsOff)->Arg(1)->Arg(32)->Arg(64)->UseRealTime();
BENCHMARK(BM_Troupe_Pool_InFlight)->Arg(1)->Arg(32)->Arg(64)->UseRealTime();
BENCHMARK(BM_Troupe_Pool_InFlight_MetricsOff)->Arg(1)->Arg(32)->Arg(64)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::choosePlacement();
  std::unique_ptr<troupe::test::ChildProcess> troupeServer, capnpServer, noMetricsServer;
  troupeAddress = "tcp://" + troupe::bench::startEchoServer(troupeServer, {"--impl", "troupe"});
  troupeNoMetricsAddress = "tcp://" +
                           troupe::bench::startEchoServer(noMetricsServer,
                                                          {"--impl", "troupe", "--metrics", "off"});
  capnpAddress = troupe::bench::startEchoServer(capnpServer, {"--impl", "capnp"});
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
