// troupe's echo client for the peer harness (/work/shared/peers): the same flags, timing and
// JSON line as the other peers' clients, calling through troupe::ActorRef (peer "troupe") or,
// with --pool, through an ActorPool over a one-member ActorGroup found in a FixedResolver (peer
// "troupe_pool"). With --adopt, requests point at the client's payload with troupe::adoptBytes
// instead of copying it into each message (peer "troupe_adopt", or "troupe_pool_adopt").
//
//   troupe_echo_client --addr HOST:PORT|unix:PATH [--calls N] [--payload BYTES] [--inflight K]
//                      [--warmup N] [--pool] [--adopt]
//
// Sizes take K / M / G suffixes (KiB, MiB, GiB). K == 1: one call at a time, each waited on.
// K > 1: K call chains on the one connection, each completion issuing the chain's next call.
// Every call is timed with steady_clock from just before the request is built to when its reply
// is available. Each reply's size is checked, and warmup replies byte for byte. Prints one line
//   {"peer":..,"payload":..,"inflight":..,"calls":..,"p50_us":..,"p99_us":..,
//    "calls_per_s":..,"MBps":..}
// (MBps: payload bytes per second in one direction, decimal MB); on failure "calls":0 and an
// "error", exit status 1. Bad flags: usage on stderr, exit status 2.

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/net/bytes.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "bench_echo.capnp.h"
#include "bench/peer_echo/peer_flags.h"

namespace {

using troupe::bench::BenchEcho;
using Clock = std::chrono::steady_clock;
using Reply = capnp::Response<BenchEcho::EchoResults>;

struct Args {
  std::string addr;
  uint64_t calls = 1000;
  uint64_t payload = 64;
  uint64_t inflight = 1;
  uint64_t warmup = 100;
  bool pool = false;
  bool adopt = false;
  const char* peer() const {
    if (adopt) return pool ? "troupe_pool_adopt" : "troupe_adopt";
    return pool ? "troupe_pool" : "troupe";
  }
};

[[noreturn]] void usage(const std::string& why) {
  fprintf(stderr,
          "troupe_echo_client: %s\n"
          "usage: troupe_echo_client --addr HOST:PORT [--calls N] [--payload BYTES] "
          "[--inflight K] [--warmup N] [--pool] [--adopt]\n",
          why.c_str());
  exit(2);
}

uint64_t parseSize(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || errno != 0 || text[0] == '-') usage("bad number " + text);
  std::string suffix = end;
  for (auto& c : suffix) c = static_cast<char>(toupper(c));
  if (suffix.empty() || suffix == "B") return v;
  if (suffix == "K" || suffix == "KB" || suffix == "KIB") return v << 10;
  if (suffix == "M" || suffix == "MB" || suffix == "MIB") return v << 20;
  if (suffix == "G" || suffix == "GB" || suffix == "GIB") return v << 30;
  usage("bad size " + text);
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--pool" || flag == "--adopt") {
      (flag == "--pool" ? a.pool : a.adopt) = true;
      continue;
    }
    if (!troupe::bench::takeFlag(argc, argv, i, flag, value)) usage("missing value for " + flag);
    if (flag == "--addr") a.addr = value;
    else if (flag == "--calls") a.calls = parseSize(value);
    else if (flag == "--payload") a.payload = parseSize(value);
    else if (flag == "--inflight") a.inflight = parseSize(value);
    else if (flag == "--warmup") a.warmup = parseSize(value);
    else usage("unknown flag " + flag);
  }
  auto colon = a.addr.rfind(':');
  bool unix = a.addr.rfind("unix:", 0) == 0;
  if (!unix && (colon == std::string::npos || colon == 0 || colon + 1 == a.addr.size())) {
    usage("--addr HOST:PORT (or unix:PATH) is required");
  }
  if (a.inflight == 0) usage("--inflight must be at least 1");
  return a;
}

// The harness's payload: deterministic xorshift bytes, so nothing compresses.
kj::Array<kj::byte> makePayload(uint64_t n) {
  auto bytes = kj::heapArray<kj::byte>(n);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<kj::byte>(x);
  }
  return bytes;
}

double percentileMicros(std::vector<int64_t>& nanos, double p) {
  if (nanos.empty()) return 0;
  size_t rank = std::clamp<size_t>(size_t(std::ceil(p * nanos.size())), 1, nanos.size());
  std::nth_element(nanos.begin(), nanos.begin() + (rank - 1), nanos.end());
  return nanos[rank - 1] / 1e3;
}

std::string jsonEscape(kj::StringPtr text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  }
  return out.substr(0, 300);
}

// Runs `calls` echoes through `call` (a function returning kj::Promise<Reply>) with `inflight`
// outstanding, recording each latency when `latencies` is given (the measured phase) and
// comparing each reply byte for byte otherwise (the warmup).
template <typename Call>
class Phase {
public:
  Phase(Call& call, kj::ArrayPtr<const kj::byte> payload, uint64_t calls,
        std::vector<int64_t>* latencies)
      : call(call), payload(payload), calls(calls), latencies(latencies) {}

  void run(kj::WaitScope& waitScope, uint64_t inflight) {
    if (inflight == 1) {
      for (uint64_t i = 0; i < calls; ++i) {
        auto start = Clock::now();
        auto reply = call().wait(waitScope);
        finished(start, reply);
      }
      return;
    }
    auto chains = kj::heapArrayBuilder<kj::Promise<void>>(inflight);
    for (uint64_t k = 0; k < inflight; ++k) chains.add(chain());
    kj::joinPromises(chains.finish()).wait(waitScope);
  }

private:
  kj::Promise<void> chain() {
    if (issued == calls) return kj::READY_NOW;
    ++issued;
    auto start = Clock::now();
    return call().then([this, start](Reply&& reply) {
      finished(start, reply);
      return chain();
    });
  }

  void finished(Clock::time_point start, Reply& reply) {
    auto end = Clock::now();
    auto got = reply.getPayload();
    KJ_REQUIRE(got.size() == payload.size(), "echo size mismatch", got.size(), payload.size());
    if (latencies != nullptr) {
      latencies->push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
    } else {
      KJ_REQUIRE(memcmp(got.begin(), payload.begin(), got.size()) == 0, "echo content mismatch");
    }
  }

  Call& call;
  kj::ArrayPtr<const kj::byte> payload;
  uint64_t calls;
  std::vector<int64_t>* latencies;
  uint64_t issued = 0;
};

// Warmup, then the measured phase; prints the result line.
template <typename Call>
void measure(const Args& a, troupe::EventLoop& loop, kj::ArrayPtr<const kj::byte> payload,
             Call call) {
  Phase<Call>(call, payload, a.warmup, nullptr).run(loop.waitScope(), a.inflight);
  std::vector<int64_t> latencies;
  latencies.reserve(a.calls);
  auto begin = Clock::now();
  Phase<Call>(call, payload, a.calls, &latencies).run(loop.waitScope(), a.inflight);
  double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  double perSecond = seconds > 0 ? latencies.size() / seconds : 0;
  double p50 = percentileMicros(latencies, 0.50);
  double p99 = percentileMicros(latencies, 0.99);
  printf("{\"peer\":\"%s\",\"payload\":%llu,\"inflight\":%llu,\"calls\":%zu,\"p50_us\":%.1f,"
         "\"p99_us\":%.1f,\"calls_per_s\":%.1f,\"MBps\":%.1f}\n",
         a.peer(), (unsigned long long)a.payload, (unsigned long long)a.inflight, latencies.size(),
         p50, p99, perSecond, perSecond * double(a.payload) / 1e6);
  fflush(stdout);
}

void run(const Args& a) {
  troupe::EventLoop loop;
  auto payload = makePayload(a.payload);
  auto request = [&](BenchEcho::Client echo) {
    if (a.adopt) {
      // The payload outlives every call, so each message borrows it (an Array with nothing to
      // free); a request made before the connection is up is copied.
      auto q = echo.echoRequest(capnp::MessageSize{8, 0});
      troupe::adoptBytes(q, &BenchEcho::EchoParams::Builder::adoptPayload,
                         kj::ArrayPtr<const kj::byte>(payload).attach());
      return q.send();
    }
    auto q = echo.echoRequest(capnp::MessageSize{payload.size() / sizeof(capnp::word) + 8, 0});
    q.setPayload(payload);
    return q.send();
  };
  // Both paths use troupe's defaults (512 MiB message limit on the shared connection). A plain
  // ActorRef has no deadline by default; the pool's 60 s default could cut a 256 MiB call on a
  // busy machine, so its calls get a generous one that only a wedged server reaches.
  std::string address = a.addr.rfind("unix:", 0) == 0 ? a.addr : "tcp://" + a.addr;
  if (!a.pool) {
    auto echo = troupe::ActorRef<BenchEcho>::connect(loop, address.c_str(), "echo");
    measure(a, loop, payload, [&]() { return echo.call(request); });
    return;
  }
  troupe::FixedResolver resolver;
  troupe::Endpoint member;
  member.name = "peer/echo-0";
  member.address = address;
  member.state = troupe::EndpointState::READY;
  resolver.add(member);
  troupe::ActorGroup<BenchEcho> group(loop, resolver, "peer", "echo");
  group.waitReady(1, 10 * kj::SECONDS).wait(loop.waitScope());
  troupe::ActorPool<BenchEcho> pool(group);
  troupe::CallOptions options{.deadline = 600 * kj::SECONDS};
  measure(a, loop, payload, [&]() { return pool.call(request, options); });
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parseArgs(argc, argv);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { run(a); })) {
    printf("{\"peer\":\"%s\",\"payload\":%llu,\"inflight\":%llu,\"calls\":0,\"error\":\"%s\"}\n",
           a.peer(), (unsigned long long)a.payload, (unsigned long long)a.inflight,
           jsonEscape(e->getDescription()).c_str());
    fflush(stdout);
    return 1;
  }
  return 0;
}
