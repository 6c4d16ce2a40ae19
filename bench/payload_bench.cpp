// Large payloads: a 1 MiB, 64 MiB and 256 MiB echo, one call at a time, from this process to a
// server process on loopback TCP. bytes_per_second counts the payload once per call (one
// direction); the echo carries it both ways.
//
// troupe's ActorRef runs with its default options (512 MiB message limit, no deadline). Plain
// Cap'n Proto's default receive limit (a traversal limit of 64 MiB) refuses a 64 MiB payload,
// on the sending side already, so the baseline is run twice: with its defaults (failing above
// 1 MiB, reported as an error) and with a 512 MiB limit on both sides, troupe's default.

#include <cstdint>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>
#include <kj/async-io.h>

#include "troupe/actor/actor_ref.h"
#include "bench_echo.capnp.h"
#include "bench/bench_peers.h"
#include "bench/bench_support.h"

namespace {

using troupe::bench::BenchEcho;

constexpr uint64_t LIMIT_MIB = 512;  // the baseline's raised limit: troupe's default

std::string troupeAddress;      // tcp://host:port
std::string capnpAddress;       // host:port, Cap'n Proto's default limit
std::string capnpLargeAddress;  // host:port, LIMIT_MIB

capnp::MessageSize sizeFor(size_t payloadBytes) { return {payloadBytes / 8 + 8, 0}; }

template <typename Call>
void runEchoes(benchmark::State& state, kj::WaitScope& ws, Call& call) {
  auto size = static_cast<size_t>(state.range(0));
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { call().wait(ws); })) {
    state.SkipWithError(e->getDescription().cStr());
    for (auto _ : state) {
    }
    return;
  }
  for (auto _ : state) {
    auto r = call().wait(ws);
    if (r.getPayload().size() != size) state.SkipWithError("echo size mismatch");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

void plainCapnp(benchmark::State& state, const std::string& address, uint64_t limitMiB) {
  auto payload = troupe::bench::payloadOf(state.range(0));
  auto io = kj::setupAsyncIo();
  troupe::bench::PlainCapnpClient client(io, address, troupe::bench::readerOptions(limitMiB));
  auto call = [&]() {
    auto q = client.echo.echoRequest(sizeFor(payload.size()));
    q.setPayload(payload);
    return q.send();
  };
  runEchoes(state, io.waitScope, call);
}

void BM_PlainCapnp_Echo_DefaultLimit(benchmark::State& state) {
  plainCapnp(state, capnpAddress, 0);
}

void BM_PlainCapnp_Echo_512MiBLimit(benchmark::State& state) {
  plainCapnp(state, capnpLargeAddress, LIMIT_MIB);
}

// troupe's echo of the benchmark's payload to `address`, with `credentials` (null: the loop's).
// The call is not marked idempotent: it goes with an id, and the server keeps a copy of its reply
// until the next call acknowledges it (README, "Errors and retries"), unless `exactlyOnce` is
// false.
void troupeEcho(benchmark::State& state, const std::string& address,
                std::shared_ptr<troupe::Credentials> credentials, bool exactlyOnce = true) {
  auto payload = troupe::bench::payloadOf(state.range(0));
  troupe::EventLoop loop;
  troupe::ActorRefOptions options;
  options.channel.credentials = kj::mv(credentials);
  options.exactlyOnce = exactlyOnce;
  auto echo = troupe::ActorRef<BenchEcho>::connect(loop, address.c_str(), "echo", options);
  auto call = [&]() {
    return echo.call([&](BenchEcho::Client c) {
      auto q = c.echoRequest(sizeFor(payload.size()));
      q.setPayload(payload);
      return q.send();
    });
  };
  runEchoes(state, loop.waitScope(), call);
}

void BM_Troupe_ActorRef_Echo(benchmark::State& state) { troupeEcho(state, troupeAddress, nullptr); }

// The same sent plainly (ActorRefOptions::exactlyOnce off): what keeping the reply costs.
void BM_Troupe_ActorRef_Echo_ExactlyOnceOff(benchmark::State& state) {
  troupeEcho(state, troupeAddress, nullptr, false);
}

// The same over tls://: what TLS costs a large call.
std::shared_ptr<troupe::Credentials> tlsClient;
std::string troupeTlsAddress;  // tls://host:port

void BM_Troupe_ActorRef_Echo_Tls(benchmark::State& state) {
  troupeEcho(state, troupeTlsAddress, tlsClient);
}

void sizes(benchmark::internal::Benchmark* b) {
  b->Arg(1 << 20)->Arg(64 << 20)->Arg(256 << 20)->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_PlainCapnp_Echo_DefaultLimit)->Apply(sizes);
BENCHMARK(BM_PlainCapnp_Echo_512MiBLimit)->Apply(sizes);
BENCHMARK(BM_Troupe_ActorRef_Echo)->Apply(sizes);
BENCHMARK(BM_Troupe_ActorRef_Echo_ExactlyOnceOff)->Apply(sizes);
BENCHMARK(BM_Troupe_ActorRef_Echo_Tls)->Apply(sizes);

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::choosePlacement();
  std::unique_ptr<troupe::test::ChildProcess> troupeServer, capnpServer, capnpLargeServer;
  troupeAddress = "tcp://" + troupe::bench::startEchoServer(troupeServer, {"--impl", "troupe"});
  capnpAddress = troupe::bench::startEchoServer(capnpServer, {"--impl", "capnp"});
  capnpLargeAddress = troupe::bench::startEchoServer(
      capnpLargeServer, {"--impl", "capnp", "--max-message-mib", std::to_string(LIMIT_MIB)});
  troupe::bench::BenchCerts certs;
  std::unique_ptr<troupe::test::ChildProcess> tlsServer;
  troupeTlsAddress = "tls://" + troupe::bench::startEchoServer(tlsServer, {"--impl", "troupe",
                                                                           "--tls", certs.dir});
  tlsClient = certs.client();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
