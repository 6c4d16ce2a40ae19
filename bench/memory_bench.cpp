// Memory: resident memory (RSS, /proc/<pid>/statm) per idle client connection and per hosted
// actor. Kernel socket buffers are not part of RSS and are not counted.
//
// * BM_*_IdleConnections: one server process; the client opens one connection and calls once
//   (warm-up), then opens 200 more, calling once on each so that the connection and the actor's
//   capability exist on both sides. Reports the growth of the server's and the client's RSS per
//   connection. troupe: one Channel and ActorRef per connection; plain Cap'n Proto: one
//   TwoPartyVatNetwork + RpcSystem per connection, as TwoPartyClient makes.
// * BM_Troupe_HostedActors: a server process hosting 1 actor and one hosting 1001, otherwise the
//   same; the difference per extra actor is the cost of hosting one (per_actor_bytes). Then a
//   client calls each of the 1001 once over one connection; the server's further growth per actor
//   is what a looked-up actor adds (looked_up_bytes_per_actor).
// * BM_Troupe_KeptReplies: what a server keeps per reply for calls that may be retried, 1 M of
//   them (the ReplyCache of troupe/actor/detail/reply_cache.h, in this process).
// * BM_PlainCapnp_Capabilities: the floor, measured in this process: 1000 capability objects
//   (the echo implementation behind a capnp::Capability::Client), what plain Cap'n Proto keeps
//   per served object before any connection refers to it.
//
// Each benchmark runs once per repetition, with fresh server processes; this process returns
// freed memory to the system (malloc_trim) before each baseline reading.

#include <malloc.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <kj/async-io.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/detail/reply_cache.h"
#include "bench_echo.capnp.h"
#include "bench/bench_peers.h"
#include "bench/bench_support.h"

namespace {

using troupe::bench::BenchEcho;
using troupe::bench::residentBytes;
using troupe::test::ChildProcess;

constexpr unsigned CONNECTIONS = 200;
constexpr unsigned ACTORS = 1000;

template <typename Response>
bool echoed(const Response& r) {
  return r.getPayload().size() == 64;
}

auto echo64 = [](BenchEcho::Client c) {
  static const kj::byte payload[64] = {1, 2, 3};
  auto q = c.echoRequest(capnp::MessageSize{16, 0});
  q.setPayload(kj::arrayPtr(payload, sizeof(payload)));
  return q.send();
};

double growthPer(uint64_t before, uint64_t after, unsigned n) {
  return (static_cast<double>(after) - static_cast<double>(before)) / n;
}

void BM_Troupe_IdleConnections(benchmark::State& state) {
  for (auto _ : state) {
    std::unique_ptr<ChildProcess> server;
    auto address = "tcp://" + troupe::bench::startEchoServer(server, {"--impl", "troupe"});
    troupe::EventLoop loop;
    auto& ws = loop.waitScope();
    std::vector<troupe::ActorRef<BenchEcho>> refs;
    refs.reserve(CONNECTIONS + 1);
    auto open = [&]() {
      refs.push_back(troupe::ActorRef<BenchEcho>::connect(loop, address.c_str(), "echo"));
      return echoed(refs.back().call(echo64).wait(ws));
    };
    bool ok = open();
    malloc_trim(0);
    auto serverBefore = residentBytes(server->pid());
    auto clientBefore = residentBytes();
    for (unsigned i = 0; i < CONNECTIONS; ++i) ok = open() && ok;
    state.counters["server_bytes_per_conn"] = growthPer(serverBefore, residentBytes(server->pid()),
                                                        CONNECTIONS);
    state.counters["client_bytes_per_conn"] = growthPer(clientBefore, residentBytes(), CONNECTIONS);
    if (!ok) state.SkipWithError("echo size mismatch");
  }
}

void BM_PlainCapnp_IdleConnections(benchmark::State& state) {
  for (auto _ : state) {
    std::unique_ptr<ChildProcess> server;
    auto address = troupe::bench::startEchoServer(server, {"--impl", "capnp"});
    auto io = kj::setupAsyncIo();
    std::vector<std::unique_ptr<troupe::bench::PlainCapnpClient>> clients;
    clients.reserve(CONNECTIONS + 1);
    auto open = [&]() {
      clients.push_back(std::make_unique<troupe::bench::PlainCapnpClient>(io, address));
      return echoed(echo64(clients.back()->echo).wait(io.waitScope));
    };
    bool ok = open();
    malloc_trim(0);
    auto serverBefore = residentBytes(server->pid());
    auto clientBefore = residentBytes();
    for (unsigned i = 0; i < CONNECTIONS; ++i) ok = open() && ok;
    state.counters["server_bytes_per_conn"] = growthPer(serverBefore, residentBytes(server->pid()),
                                                        CONNECTIONS);
    state.counters["client_bytes_per_conn"] = growthPer(clientBefore, residentBytes(), CONNECTIONS);
    if (!ok) state.SkipWithError("echo size mismatch");
  }
}

// The server's RSS once it hosts `actors` actors and one call reached "echo"; with `callAll`,
// after one call to each of them too (all over one connection).
uint64_t hostingServerRss(unsigned actors, bool callAll, bool& ok) {
  std::unique_ptr<ChildProcess> server;
  auto address = "tcp://" + troupe::bench::startEchoServer(server, {"--impl", "troupe", "--actors",
                                                                    std::to_string(actors)});
  troupe::EventLoop loop;
  auto& ws = loop.waitScope();
  auto channel = troupe::Channel::open(loop, address.c_str());
  ok = echoed(troupe::ActorRef<BenchEcho>(channel->addRef(), "echo").call(echo64).wait(ws)) && ok;
  if (callAll) {
    std::vector<troupe::ActorRef<BenchEcho>> refs;
    for (unsigned a = 1; a < actors; ++a) {
      refs.emplace_back(channel->addRef(), kj::str("echo", a));
      ok = echoed(refs.back().call(echo64).wait(ws)) && ok;
    }
  }
  return residentBytes(server->pid());
}

void BM_Troupe_HostedActors(benchmark::State& state) {
  for (auto _ : state) {
    bool ok = true;
    auto one = hostingServerRss(1, false, ok);
    auto many = hostingServerRss(ACTORS + 1, false, ok);
    auto manyCalled = hostingServerRss(ACTORS + 1, true, ok);
    state.counters["per_actor_bytes"] = growthPer(one, many, ACTORS);
    state.counters["looked_up_bytes_per_actor"] = growthPer(many, manyCalled, ACTORS);
    if (!ok) state.SkipWithError("echo size mismatch");
  }
}

class EchoImpl final : public BenchEcho::Server {};

void BM_PlainCapnp_Capabilities(benchmark::State& state) {
  for (auto _ : state) {
    auto io = kj::setupAsyncIo();
    std::vector<capnp::Capability::Client> caps;
    caps.reserve(ACTORS);
    malloc_trim(0);
    auto before = residentBytes();
    for (unsigned i = 0; i < ACTORS; ++i) caps.emplace_back(kj::heap<EchoImpl>());
    state.counters["per_actor_bytes"] = growthPer(before, residentBytes(), ACTORS);
  }
}

// What a server keeps per reply for calls retried after a broken connection (README, "Errors and
// retries"): 1 M replies of a 64-byte echo, from 100 callers of 10,000 calls each (the default
// bound per caller), kept by a ReplyCache as an ActorServer's, in this process and with the
// defaults' other bounds (ReplyCacheOptions). Reports the growth of RSS per kept reply and what
// the cache counts per reply against its byte bounds.
constexpr unsigned KEPT_CALLERS = 100;
constexpr unsigned KEPT_PER_CALLER = 10000;

// What a kept call's context says of its cancellation (OnceContext::cancellable).
const bool CANCELLABLE = true;

void BM_Troupe_KeptReplies(benchmark::State& state) {
  using troupe::actor_detail::StoredReply;
  static const kj::byte payload[64] = {1, 2, 3};
  for (auto _ : state) {
    troupe::EventLoop loop;
    malloc_trim(0);
    auto before = residentBytes();
    troupe::actor_detail::ReplyCache cache(loop.timer(), 1, {});
    for (uint64_t caller = 1; caller <= KEPT_CALLERS; ++caller) {
      // Held until the replies are kept, as a call's connection holds its.
      kj::Vector<kj::Promise<kj::Own<StoredReply>>> replies;
      for (uint64_t seq = 1; seq <= KEPT_PER_CALLER; ++seq) {
        auto message = kj::heap<capnp::MallocMessageBuilder>(32);
        message->getRoot<capnp::AnyPointer>().initAs<BenchEcho::EchoResults>().setPayload(
            kj::arrayPtr(payload, sizeof(payload)));
        // As the gate does: look the call up, start it, and keep its reply as it ends.
        troupe::actor_detail::OnceCallId id{caller, seq, 1, false};
        if (cache.find(id) != nullptr) state.SkipWithError("a new call was known");
        auto started = cache.start(id, CANCELLABLE);
        replies.add(kj::mv(started.reply));
        cache.finished(started.entry, kj::refcounted<StoredReply>(kj::mv(message)));
      }
      loop.waitScope().poll();
      replies.clear();
    }
    auto& stats = cache.stats();
    if (stats.replies != uint64_t(KEPT_CALLERS) * KEPT_PER_CALLER) {
      state.SkipWithError("the cache dropped replies within its default bounds");
    }
    state.counters["replies_kept"] = static_cast<double>(stats.replies);
    state.counters["rss_bytes_per_reply"] = growthPer(before, residentBytes(),
                                                      static_cast<unsigned>(stats.replies));
    state.counters["counted_bytes_per_reply"] = static_cast<double>(stats.bytes) /
                                                static_cast<double>(stats.replies);
  }
}

BENCHMARK(BM_PlainCapnp_IdleConnections)->Iterations(1)->UseRealTime();
BENCHMARK(BM_Troupe_IdleConnections)->Iterations(1)->UseRealTime();
BENCHMARK(BM_PlainCapnp_Capabilities)->Iterations(1)->UseRealTime();
BENCHMARK(BM_Troupe_HostedActors)->Iterations(1)->UseRealTime();
BENCHMARK(BM_Troupe_KeptReplies)->Iterations(1)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::choosePlacement();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
