// The Python module's calls beside C++'s, in one run, against the same echo server (64-byte
// payload, one member, a fixed resolver): pool.call() from Python one at a time (p50 and
// calls/s) and pool.call_async() with 32 in flight under asyncio (calls/s), next to
// ActorPool::call() from C++ the same two ways. The interpreter is embedded (pybind11), so each
// Python iteration is one call of a Python function that makes the call; what that adds is
// measured by BM_Python_Noop. Pinned to CPU 0 by default (TROUPE_BENCH_PIN=free leaves
// placement to the scheduler), like the other benchmarks; the Python module's own loop thread
// then shares that CPU too.
//
// And a Python actor (bench_py_actors.PyEcho, a troupe.actor class in a replica of its own,
// python3 -m troupe.host) beside the C++ one: the same 64-byte echo from the same Python pool,
// and a 64 MiB argument taken one call at a time, a NumPy array to the Python actor from Python
// beside a Data argument to the C++ actor from C++.

#include <signal.h>
#include <string.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <pybind11/embed.h>

#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "bench_echo.capnp.h"
#include "bench/bench_peers.h"
#include "bench/bench_support.h"
#include "bench/in_flight.h"

namespace py = pybind11;

namespace {

using troupe::bench::BenchEcho;
using Clock = std::chrono::steady_clock;

constexpr size_t PAYLOAD_BYTES = 64;

std::string echoAddress;    // tcp://host:port
std::string pyEchoAddress;  // the Python actor's
constexpr size_t LARGE_BYTES = 64 << 20;

// The Python side: a pool over the one member, and the functions each iteration calls.
constexpr const char* PYTHON_SETUP = R"(
import asyncio
import troupe

pool = troupe.open_resolver(resolver_url).group("one", "echo").pool()
payload = b"x" * payload_bytes
loop = asyncio.new_event_loop()

def call_once():
    if len(pool.call("echo.echo", payload=payload)["payload"]) != payload_bytes:
        raise RuntimeError("echo size mismatch")

def noop():
    pass

import numpy as np
from bench_py_actors import PyEcho

py_pool = troupe.open_resolver(py_resolver_url).group("pyone", "echo", PyEcho).pool()
large = np.ones(large_bytes // 4, dtype=np.float32)

def py_call_once():
    if len(py_pool.call("echo", payload)) != payload_bytes:
        raise RuntimeError("echo size mismatch")

def py_take_large():
    if py_pool.call("take", large) != large_bytes:
        raise RuntimeError("take size mismatch")

async def _chain(left):
    while left[0] > 0:
        left[0] -= 1
        r = await pool.call_async("echo.echo", payload=payload)
        if len(r["payload"]) != payload_bytes:
            raise RuntimeError("echo size mismatch")

async def _round(calls, in_flight):
    left = [calls]
    await asyncio.gather(*(_chain(left) for _ in range(in_flight)))

def round_async(calls, in_flight):
    loop.run_until_complete(_round(calls, in_flight))
)";

py::dict& python() {
  static py::dict* scope = nullptr;
  if (scope == nullptr) {
    scope = new py::dict();
    (*scope)["__builtins__"] = py::module_::import("builtins");
    (*scope)["resolver_url"] = "fixed:one/echo-0=" + echoAddress;
    (*scope)["py_resolver_url"] = "fixed:pyone/echo-0=" + pyEchoAddress;
    (*scope)["payload_bytes"] = PAYLOAD_BYTES;
    (*scope)["large_bytes"] = LARGE_BYTES;
    py::exec(PYTHON_SETUP, *scope);
    (*scope)["call_once"]();  // connect, fetch the schema, warm up
    (*scope)["py_call_once"]();
  }
  return *scope;
}

// One call at a time of the Python function `name` (a Python pool's call), p50 and calls/s.
void pythonPingPong(benchmark::State& state, const char* name) {
  auto call = python()[name];
  for (int i = 0; i < 200; ++i) call();
  std::vector<double> micros;
  micros.reserve(1 << 20);
  for (auto _ : state) {
    auto start = Clock::now();
    call();
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  state.SetItemsProcessed(state.iterations());
  troupe::bench::reportPercentiles(state, micros);
}

void BM_Python_Pool_PingPong(benchmark::State& state) { pythonPingPong(state, "call_once"); }

// The same echo from the same Python pool, to the Python actor.
void BM_Python_PyActor_PingPong(benchmark::State& state) { pythonPingPong(state, "py_call_once"); }

// A 64 MiB NumPy array (troupe.Tensor) to the Python actor from a Python pool, one at a time.
void BM_Python_PyActor_Take64MiB(benchmark::State& state) {
  auto take = python()["py_take_large"];
  take();
  for (auto _ : state) take();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * LARGE_BYTES));
}

// What calling a Python function from the benchmark loop costs by itself.
void BM_Python_Noop(benchmark::State& state) {
  auto noop = python()["noop"];
  for (auto _ : state) noop();
}

void BM_Python_Pool_InFlight(benchmark::State& state) {
  auto round = python()["round_async"];
  auto inFlight = state.range(0);
  round(troupe::bench::CALLS_PER_ROUND, inFlight);  // warm-up
  for (auto _ : state) round(troupe::bench::CALLS_PER_ROUND, inFlight);
  state.SetItemsProcessed(
      static_cast<int64_t>(state.iterations() * troupe::bench::CALLS_PER_ROUND));
}

// A C++ pool over the same member, on a loop of this thread.
struct CppPool {
  CppPool() {
    troupe::Endpoint member;
    member.name = "one/echo-0";
    member.address = echoAddress;
    member.state = troupe::EndpointState::READY;
    resolver.add(member);
    group.waitReady(1, 10 * kj::SECONDS).wait(loop.waitScope());
  }
  auto send() {
    return pool.call([this](BenchEcho::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{PAYLOAD_BYTES / 8 + 4, 0});
      q.setPayload(payload);
      return q.send();
    });
  }
  troupe::EventLoop loop;
  troupe::FixedResolver resolver;
  troupe::ActorGroup<BenchEcho> group{loop, resolver, "one", "echo"};
  troupe::ActorPool<BenchEcho> pool{group};
  std::vector<kj::byte> payloadBytes = std::vector<kj::byte>(PAYLOAD_BYTES, 'x');
  kj::ArrayPtr<const kj::byte> payload = kj::arrayPtr(payloadBytes.data(), payloadBytes.size());
};

void BM_Cpp_Pool_PingPong(benchmark::State& state) {
  CppPool p;
  for (int i = 0; i < 200; ++i) p.send().wait(p.loop.waitScope());
  std::vector<double> micros;
  micros.reserve(1 << 20);
  for (auto _ : state) {
    auto start = Clock::now();
    auto r = p.send().wait(p.loop.waitScope());
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (r.getPayload().size() != PAYLOAD_BYTES) state.SkipWithError("echo size mismatch");
  }
  state.SetItemsProcessed(state.iterations());
  troupe::bench::reportPercentiles(state, micros);
}

// A 64 MiB Data argument to the C++ actor from a C++ pool, one at a time.
void BM_Cpp_Pool_Take64MiB(benchmark::State& state) {
  CppPool p;
  std::vector<kj::byte> large(LARGE_BYTES, 1);
  auto take = [&]() {
    return p.pool
        .call([&](BenchEcho::Client c) {
          auto q = c.takeRequest(capnp::MessageSize{LARGE_BYTES / 8 + 8, 0});
          q.setPayload(kj::arrayPtr(large.data(), large.size()));
          return q.send();
        })
        .wait(p.loop.waitScope());
  };
  take();
  for (auto _ : state) {
    if (take().getSize() != LARGE_BYTES) state.SkipWithError("take size mismatch");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * LARGE_BYTES));
}

void BM_Cpp_Pool_InFlight(benchmark::State& state) {
  CppPool p;
  auto send = [&]() { return p.send(); };
  troupe::bench::runRounds(state, p.loop.waitScope(), send, PAYLOAD_BYTES);
}

BENCHMARK(BM_Cpp_Pool_PingPong)->UseRealTime();
BENCHMARK(BM_Python_Pool_PingPong)->UseRealTime();
BENCHMARK(BM_Python_PyActor_PingPong)->UseRealTime();
BENCHMARK(BM_Python_Noop);
BENCHMARK(BM_Cpp_Pool_Take64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Python_PyActor_Take64MiB)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cpp_Pool_InFlight)->Arg(32)->UseRealTime();
BENCHMARK(BM_Python_Pool_InFlight)->Arg(32)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::choosePlacement();
  std::unique_ptr<troupe::test::ChildProcess> server;
  echoAddress = "tcp://" + troupe::bench::startEchoServer(server, {"--impl", "troupe"});
  // The Python actor, in a replica of its own with no resolver (the pool's is fixed:).
  troupe::test::ChildProcess pyServer(
      "/usr/bin/python3",
      {"-m", "troupe.host", "bench_py_actors:PyEcho", "--name", "echo", "--listen",
       "tcp://127.0.0.1:0"},
      {std::string("PYTHONPATH=") + TROUPE_PYTHON_DIR + ":" + TROUPE_BENCH_DIR,
       "TROUPE_JOB_ID=pyone", "TROUPE_TASK_INDEX=0", "TROUPE_NUM_TASKS=1", "TROUPE_RESOLVER="});
  auto serving = pyServer.readLine(30000);
  if (serving.rfind("SERVING ", 0) != 0) {
    fprintf(stderr, "the Python actor did not start: '%s'\n", serving.c_str());
    return 1;
  }
  pyEchoAddress = serving.substr(strlen("SERVING "));
  py::scoped_interpreter interpreter;
  py::module_::import("sys").attr("path").attr("insert")(0, TROUPE_PYTHON_DIR);
  py::module_::import("sys").attr("path").attr("insert")(0, TROUPE_BENCH_DIR);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // The module's loop stops before the interpreter goes (as atexit would).
  py::module_::import("troupe._troupe").attr("_shutdown")();
  pyServer.kill(SIGTERM);
  pyServer.wait();
  return 0;
}
