#pragma once
// K calls in flight: K call chains each send their next call when the previous one returns,
// until a round of CALLS_PER_ROUND calls is done; items_per_second is calls per second. The echo
// benchmarks' (throughput_bench, python_bench) shared loop.

#include <cstdint>

#include <benchmark/benchmark.h>
#include <kj/async.h>

namespace troupe::bench {

constexpr uint64_t CALLS_PER_ROUND = 4096;

// What K chains share in one round: calls left to start, and replies that came back wrong.
struct Round {
  size_t payloadBytes;  // what each reply's payload must hold
  uint64_t left = CALLS_PER_ROUND;
  uint64_t bad = 0;
};

// One chain: `send()` makes a call and returns its promise; the chain sends the next call when
// a reply arrives, while the round has calls left.
template <typename Send>
kj::Promise<void> chain(Send& send, Round& round) {
  if (round.left == 0) return kj::READY_NOW;
  --round.left;
  return send().then([&send, &round](auto&& response) {
    if (response.getPayload().size() != round.payloadBytes) ++round.bad;
    return chain(send, round);
  });
}

// Runs rounds of CALLS_PER_ROUND calls with `inFlight` chains, after a warm-up round.
template <typename Send>
void runRounds(benchmark::State& state, kj::WaitScope& ws, Send& send, size_t payloadBytes) {
  auto inFlight = static_cast<unsigned>(state.range(0));
  auto round = [&]() {
    Round r{payloadBytes};
    auto chains = kj::heapArrayBuilder<kj::Promise<void>>(inFlight);
    for (unsigned i = 0; i < inFlight; ++i) chains.add(chain(send, r));
    kj::joinPromises(chains.finish()).wait(ws);
    return r.bad;
  };
  round();
  for (auto _ : state) {
    if (round() != 0) state.SkipWithError("echo size mismatch");
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * CALLS_PER_ROUND));
}

}  // namespace troupe::bench
