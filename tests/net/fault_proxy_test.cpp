// FaultProxy (tests/support/fault_proxy.h) between an ActorRef and a real ActorServer: where it
// cuts a connection decides whether the server ran the call, and its random mode repeats itself
// for a seed.

#include "tests/support/fault_proxy.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/calculator_calls.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/server_fixture.h"

namespace troupe::test {
namespace {

using Which = capnp::rpc::Message::Which;

class FaultProxyTest : public ServerFixture {
protected:
  ~FaultProxyTest() noexcept override {}

  // Plain Cap'n Proto calls (no ExactlyOnce envelope), so that the rules see calc.add itself and
  // a broken connection leaves the call as it found it (tests/actor/exactly_once_test.cpp
  // covers the retries).
  ActorRef<Calculator> throughProxy(FaultProxy& via) {
    return ActorRef<Calculator>::connect(loop, via.address().c_str(), "calc",
                                         {.exactlyOnce = false});
  }

  // How many calls of calc.add the server started, and finished with a reply.
  double addsStarted() {
    return server->metrics().value("troupe_calls_started_total",
                                   {{"job", "job-1"}, {"actor", "calc"}, {"method", "add"}});
  }
  double addsAnswered() {
    return server->metrics().value(
        "troupe_calls_total",
        {{"job", "job-1"}, {"actor", "calc"}, {"method", "add"}, {"code", "ok"}});
  }

  // Waits until `via` has seen `count` connections end or be cut.
  void awaitConnectionsDone(FaultProxy& via, uint64_t count) {
    while (via.stats().ended + via.stats().cut < count) await(loop, via.changed());
  }

  FaultProxy proxy{loop, address};
};

TEST_F(FaultProxyTest, WithoutRulesEveryMessageGoesThroughWhole) {
  auto calc = throughProxy(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  EXPECT_EQ(await(loop, add(calc, 3, 4)), 7);
  EXPECT_EQ(addsAnswered(), 2);

  // What the server read and wrote is what the proxy forwarded, message for message and byte for
  // byte (the client's last messages may still be on their way).
  MetricLabels transport = {{"job", "job-1"}, {"server", "actor"}};
  ASSERT_TRUE(pollUntil([&]() {
    auto m = server->metrics();
    auto& s = proxy.stats();
    return m.value("troupe_messages_received_total", transport) == s.messagesToServer &&
           m.value("troupe_received_bytes_total", transport) == s.bytesToServer &&
           m.value("troupe_messages_sent_total", transport) == s.messagesToClient &&
           m.value("troupe_sent_bytes_total", transport) == s.bytesToClient;
  }));
  auto& s = proxy.stats();
  EXPECT_GE(s.messagesToServer, 4u);  // a bootstrap, the lookup of "calc" and two calls at least
  EXPECT_GE(s.messagesToClient, 4u);
  EXPECT_EQ(s.accepted, 1u);
  EXPECT_EQ(s.open, 1u);
  EXPECT_EQ(s.cut, 0u);
  EXPECT_EQ(proxy.cuts().size(), 0u);
}

TEST_F(FaultProxyTest, CutBeforeTheRequestArrivesTheCallNeverRuns) {
  // The connection's first messages (bootstrap, lookup) go through; the call does not.
  auto rule = proxy.addRule({.match = callTo<Calculator>(0)});
  auto calc = throughProxy(proxy);
  EXPECT_EQ(awaitError(loop, add(calc, 1, 2)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(addsStarted(), 0);
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
  ASSERT_EQ(proxy.cuts().size(), 1u);
  auto cut = proxy.cuts()[0];
  EXPECT_EQ(cut.connection, 1u);
  EXPECT_EQ(cut.direction, Direction::CLIENT_TO_SERVER);
  EXPECT_EQ(cut.bytesForwarded, 0u);
  EXPECT_EQ(cut.rule, rule);
  EXPECT_EQ(cut.message, proxy.stats().messagesToServer + 1);  // what went before went whole
  EXPECT_EQ(proxy.stats().randomCuts, 0u);

  // The rule is spent: the client connects again and gets through.
  EXPECT_EQ(await(loop, add(calc, 2, 3)), 5);
  EXPECT_EQ(addsAnswered(), 1);
  EXPECT_EQ(proxy.stats().accepted, 2u);
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
}

TEST_F(FaultProxyTest, ARuleForEveryConnectionCutsEachUntilRemoved) {
  auto rule = proxy.addRule(
      {.match = callTo<Calculator>(0), .kind = CutKind::RESET, .everyConnection = true});
  auto calc = throughProxy(proxy);
  EXPECT_EQ(awaitError(loop, add(calc, 1, 2)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(awaitError(loop, add(calc, 1, 2)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(proxy.cutsBy(rule), 2u);
  EXPECT_EQ(proxy.stats().accepted, 2u);
  ASSERT_EQ(proxy.cuts().size(), 2u);
  EXPECT_EQ(proxy.cuts()[1].connection, 2u);
  EXPECT_EQ(proxy.cuts()[1].kind, CutKind::RESET);
  EXPECT_EQ(addsStarted(), 0);

  proxy.removeRule(rule);
  EXPECT_EQ(await(loop, add(calc, 2, 3)), 5);
  EXPECT_EQ(proxy.stats().accepted, 3u);
}

TEST_F(FaultProxyTest, CutAfterTheRequestArrivedTheCallRanOnce) {
  // A first call makes the connection and resolves the actor: the next call is one message,
  // and its reply the next message back.
  auto calc = throughProxy(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 1)), 2);
  auto rule = proxy.addRule({.match = callTo<Calculator>(0), .point = CutPoint::BEFORE_REPLY});
  auto toClient = proxy.stats().messagesToClient;

  EXPECT_EQ(awaitError(loop, add(calc, 2, 2)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(addsStarted(), 2);
  EXPECT_EQ(addsAnswered(), 2);  // the server replied; the reply went nowhere
  EXPECT_EQ(proxy.stats().messagesToClient, toClient);
  ASSERT_EQ(proxy.cuts().size(), 1u);
  EXPECT_EQ(proxy.cuts()[0].direction, Direction::SERVER_TO_CLIENT);
  EXPECT_EQ(proxy.cuts()[0].rule, rule);

  EXPECT_EQ(await(loop, add(calc, 3, 3)), 6);
  EXPECT_EQ(addsAnswered(), 3);
}

TEST_F(FaultProxyTest, CutInsideTheReplyTheCallRanOnce) {
  auto calc = throughProxy(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 1)), 2);
  auto rule = proxy.addRule({.direction = Direction::SERVER_TO_CLIENT,
                             .match = messageIs(Which::RETURN),
                             .point = CutPoint::INSIDE,
                             .bytesInside = 16});
  auto before = proxy.stats();

  EXPECT_EQ(awaitError(loop, add(calc, 2, 2)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(addsStarted(), 2);
  EXPECT_EQ(addsAnswered(), 2);
  ASSERT_EQ(proxy.cuts().size(), 1u);
  auto cut = proxy.cuts()[0];
  EXPECT_EQ(cut.direction, Direction::SERVER_TO_CLIENT);
  EXPECT_EQ(cut.bytesForwarded, 16u);
  EXPECT_EQ(cut.rule, rule);
  // 16 bytes of the reply reached the client, and no whole message.
  EXPECT_EQ(proxy.stats().messagesToClient, before.messagesToClient);
  EXPECT_EQ(proxy.stats().bytesToClient, before.bytesToClient + 16);

  EXPECT_EQ(await(loop, add(calc, 3, 3)), 6);
}

// What a run of many calls, each on a connection of its own, met under random faults.
struct RandomRun {
  std::vector<bool> succeeded;
  std::vector<CutRecord> cuts;
};

TEST_F(FaultProxyTest, RandomFaultsCutSomeConnectionsTheSameWayForASeed) {
  constexpr int CALLS = 40;
  auto run = [&](uint64_t seed) {
    RandomRun r;
    FaultProxy random(loop, address);
    random.setRandomFaults(RandomFaults{.seed = seed, .probability = 0.05});
    for (int i = 0; i < CALLS; ++i) {
      {
        auto calc = throughProxy(random);
        r.succeeded.push_back(await(loop, add(calc, i, 1)
                                              .then([](int64_t) { return true; },
                                                    [](kj::Exception&&) { return false; })));
      }
      // One connection at a time, so that each call's connection has the same number in every
      // run.
      awaitConnectionsDone(random, i + 1);
    }
    EXPECT_EQ(random.stats().accepted, uint64_t(CALLS));
    for (auto& c : random.cuts()) r.cuts.push_back(c);
    return r;
  };

  auto first = run(42);
  auto again = run(42);
  EXPECT_EQ(first.succeeded, again.succeeded);
  EXPECT_EQ(first.cuts, again.cuts);

  // Some calls failed and some got through; cuts fell on boundaries and inside messages.
  auto failed = std::count(first.succeeded.begin(), first.succeeded.end(), false);
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, CALLS);
  EXPECT_GE(first.cuts.size(), size_t(failed));
  auto inside = std::count_if(first.cuts.begin(), first.cuts.end(),
                              [](const CutRecord& c) { return c.bytesForwarded > 0; });
  EXPECT_GT(inside, 0);
  EXPECT_LT(size_t(inside), first.cuts.size());
  for (auto& c : first.cuts) EXPECT_EQ(c.rule, 0u);

  // Another seed cuts elsewhere.
  EXPECT_NE(run(7).cuts, first.cuts);
}

TEST_F(FaultProxyTest, StopClosesConnectionsAndAGoneTargetIsUnreachable) {
  {
    auto calc = throughProxy(proxy);
    EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
    proxy.stop();
    // On the connection stop() closes, or on a new one the stopped proxy does not accept.
    auto code = awaitError(loop, add(calc, 1, 2)).code;
    EXPECT_TRUE(code == ErrorCode::DISCONNECTED || code == ErrorCode::UNREACHABLE);
  }
  EXPECT_EQ(proxy.stats().ended, 1u);
  EXPECT_EQ(proxy.stats().open, 0u);
  EXPECT_EQ(proxy.stats().cut, 0u);

  // A proxy in front of the stopped one: nothing listens at its target any more.
  FaultProxy front(loop, proxy.address());
  auto calc = throughProxy(front);
  EXPECT_EQ(awaitError(loop, add(calc, 1, 2)).code, ErrorCode::DISCONNECTED);
  while (front.stats().unreachable < 1) await(loop, front.changed());
  EXPECT_EQ(front.stats().accepted, 1u);
  EXPECT_EQ(front.stats().open, 0u);
}

TEST_F(FaultProxyTest, OnlyLoopbackTargetsAreForwardedTo) {
  for (auto target : {"tcp://10.0.0.1:80", "192.168.1.1:80", "tcp://example.com:80",
                      "tcp://[2001:db8::1]:80", "tls://127.0.0.1:80", "unix:/tmp/fault.sock"}) {
    EXPECT_EQ(thrownBy([&]() { FaultProxy p(loop, target); }).code, ErrorCode::INVALID_ARGUMENT)
        << target;
  }
  for (auto target : {"tcp://127.0.0.2:80", "localhost:80", "tcp://[::1]:80"}) {
    FaultProxy p(loop, target);
    EXPECT_EQ(p.address().rfind("tcp://127.0.0.1:", 0), 0u) << target;
  }
}

}  // namespace
}  // namespace troupe::test
