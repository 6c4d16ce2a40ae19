// An ActorServer in this process fed what a peer may send: each input is written over a fresh
// connection (then shut down for writing), the server's answer read until it closes the
// connection, and then the server must still serve a real call. A server that crashes, trips a
// sanitizer, keeps the connection open, stops accepting or stops answering is reported; the
// input's own connection failing is the expected outcome of most inputs.
//
// The server hosts the test suite's "calc" (ScientificCalculator), "echo" and "member" actors,
// with a 1 MiB message limit (a message just under the default 512 MiB limit would cost each
// input that much memory, and the limit's code is the same) and no cluster token, so that an
// input reaches the actors once it authenticates with any token.

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/raw_peer.h"
#include "tests/support/test_actors.h"

namespace troupe::fuzz {
namespace {

constexpr uint64_t MAX_MESSAGE_BYTES = 1 << 20;

// How often the check goes over a new connection rather than the one kept for checks: a server
// could go on answering on an old connection while new ones fail past accepting (authenticating,
// finding the actor).
constexpr uint64_t FRESH_CHECK_EVERY = 64;

JobContext job() {
  JobContext job;
  job.jobId = "fuzz";
  return job;
}

// Built on the first input and never destroyed: libFuzzer ends the process with exit(), and
// tearing a server down then would only add ways to fail that no input caused.
struct Target {
  EventLoop loop{{.randomSeed = uint64_t{1}}};
  bool withoutCredentials = (setLoopCredentials(loop, noCredentials()), true);
  ActorServer server{loop, job(), {.maxMessageBytes = MAX_MESSAGE_BYTES}};
  std::string address;
  kj::Own<kj::NetworkAddress> raw;
  kj::Maybe<ActorRef<test::Echo>> echo;
  uint64_t inputs = 0;

  Target() {
    server.host<test::ScientificCalculator>("calc", kj::heap<test::CalculatorImpl>());
    server.host<test::Echo>("echo", kj::heap<test::EchoImpl>());
    server.host<test::Member>("member", kj::heap<test::MemberImpl>("member"));
    address = server.listen(privateSocketAddress());
    raw = rawAddress(loop, address);
  }

  ActorRef<test::Echo> connect() {
    return ActorRef<test::Echo>::connect(loop, address.c_str(), "echo",
                                         {.channel = {.maxMessageBytes = MAX_MESSAGE_BYTES}});
  }

  // One echo round trip, on the kept connection or a new one.
  void checkServing() {
    if (echo == nullptr || inputs % FRESH_CHECK_EVERY == 0) echo = connect();
    auto& ref = KJ_ASSERT_NONNULL(echo);
    auto call = ref.call(
        [](test::Echo::Client c) {
          auto q = c.echoRequest();
          q.setPayload(kj::StringPtr("still serving").asBytes());
          return q.send();
        },
        {.deadline = CLOSE_TIMEOUT});
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  auto r = call.wait(loop.waitScope());
                  check(r.getPayload() == kj::StringPtr("still serving").asBytes(),
                        "the echo came back changed");
                })) {
      fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
      check(false, "the server stopped serving");
    }
    check(server.state() == ServerState::SERVING, "the server left SERVING");
  }
};

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  static auto& target = *new Target;
  ++target.inputs;
  exchangeRaw(target.loop, *target.raw, kj::arrayPtr(data, size));
  target.checkServing();
  return 0;
}
