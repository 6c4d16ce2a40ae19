// Calls not marked idempotent, through a FaultProxy that cuts their connections where a test
// says: each runs once and its caller gets its result while the server lives (schemas/actor.capnp
// ExactlyOnce); MAY_HAVE_RUN only where the server restarted or no longer kept the reply.

#include <gtest/gtest.h>

#include "troupe/schemas/actor.capnp.h"
#include "tests/support/calculator_calls.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/server_fixture.h"

namespace troupe::test {
namespace {

using Which = capnp::rpc::Message::Which;

// A call of ExactlyOnce.call: how every call that is not idempotent travels.
MessageMatcher onceCall() { return callTo<schema::ExactlyOnce>(0); }

class ExactlyOnceTest : public ServerFixture {
protected:
  ~ExactlyOnceTest() noexcept override {}

  // A server of job "job-1" hosting "calc" and "blocker" (with `blockerState`) with `options`,
  // listening at `at`; returns its address.
  std::string startServer(kj::Own<ActorServer>& out, ActorServerOptions options,
                          BlockerState& blockerState, kj::StringPtr at = "tcp://127.0.0.1:0") {
    JobContext job;
    job.jobId = "job-1";
    out = kj::heap<ActorServer>(loop, job, kj::mv(options));
    out->host<ScientificCalculator>("calc", kj::heap<CalculatorImpl>());
    out->host<Blocker>("blocker", kj::heap<BlockerImpl>(blockerState), {.maxConcurrency = 0});
    return out->listen(at);
  }

  ActorRef<Calculator> calcVia(FaultProxy& via) {
    return ActorRef<Calculator>::connect(loop, via.address().c_str(), "calc");
  }
  ActorRef<Blocker> blockerVia(FaultProxy& via) {
    return ActorRef<Blocker>::connect(loop, via.address().c_str(), "blocker");
  }

  // How many calls of calc.add `s` started: each is one run.
  static double addsStarted(ActorServer& s) {
    return s.metrics().value("troupe_calls_started_total",
                             {{"job", "job-1"}, {"actor", "calc"}, {"method", "add"}});
  }
  // One of the server's reply cache series (troupe_server_replies_*).
  static double replies(ActorServer& s, kj::StringPtr name) {
    return s.metrics().value(name, {{"job", "job-1"}});
  }

  FaultProxy proxy{loop, address};
};

TEST_F(ExactlyOnceTest, ACallCutBeforeItReachesTheServerIsSentAgainAndRunsOnce) {
  auto calc = calcVia(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);  // connected: the rule picks the next call
  auto rule = proxy.addRule({.match = onceCall()});
  EXPECT_EQ(await(loop, add(calc, 20, 22)), 42);
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
  EXPECT_EQ(addsStarted(*server), 2);
  EXPECT_EQ(replies(*server, "troupe_server_replies_replayed_total"), 0);
}

TEST_F(ExactlyOnceTest, ACallCutAfterItArrivedGetsTheReplyTheServerKeptWithoutRunningAgain) {
  auto calc = calcVia(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  auto rule = proxy.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY});
  EXPECT_EQ(await(loop, add(calc, 20, 22)), 42);
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
  EXPECT_EQ(addsStarted(*server), 2);
  EXPECT_EQ(replies(*server, "troupe_server_replies_replayed_total"), 1);
}

TEST_F(ExactlyOnceTest, ACallWhoseReplyIsCutHalfwayGetsItWholeWithoutRunningAgain) {
  auto calc = calcVia(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  auto rule = proxy.addRule({.direction = Direction::SERVER_TO_CLIENT,
                             .match = messageIs(Which::RETURN),
                             .point = CutPoint::INSIDE,
                             .bytesInside = 24,
                             .kind = CutKind::RESET});
  EXPECT_EQ(await(loop, add(calc, 20, 22)), 42);
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
  EXPECT_EQ(addsStarted(*server), 2);
  EXPECT_EQ(replies(*server, "troupe_server_replies_replayed_total"), 1);
}

TEST_F(ExactlyOnceTest, AnErrorTheActorRaisedIsKeptAndReplayedLikeAResult) {
  auto calc = calcVia(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  proxy.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY});
  auto failure = awaitError(loop, add(calc, INT64_MAX, 1));
  EXPECT_EQ(failure.code, ErrorCode::FAILED) << failure.text;
  EXPECT_TRUE(failure.mentions("overflow")) << failure.text;
  EXPECT_EQ(addsStarted(*server), 2);
  EXPECT_EQ(replies(*server, "troupe_server_replies_replayed_total"), 1);
}

TEST_F(ExactlyOnceTest, RetriesAttachToACallStillRunningAndToOneThatFinished) {
  auto b = blockerVia(proxy);
  auto first = hold(b, "a");
  await(loop, blocker.whenStarted(1));
  // The second call arrives; the connection is cut when the server next writes: a's reply.
  auto rule = proxy.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY});
  auto second = hold(b, "b");
  await(loop, blocker.whenStarted(2));
  EXPECT_TRUE(blocker.release("a"));
  // Both are sent again on a new connection: a gets its kept reply, b waits for the call that
  // runs.
  EXPECT_EQ(kj::StringPtr(await(loop, kj::mv(first)).getTag()), "a");
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
  ASSERT_TRUE(
      pollUntil([&]() { return replies(*server, "troupe_server_replies_replayed_total") == 2; }));
  EXPECT_EQ(replies(*server, "troupe_server_replies_running"), 1);
  EXPECT_TRUE(blocker.release("b"));
  EXPECT_EQ(kj::StringPtr(await(loop, kj::mv(second)).getTag()), "b");
  EXPECT_EQ(blocker.started, 2u);
  EXPECT_EQ(blocker.finished, 2u);
}

TEST_F(ExactlyOnceTest, ACallCutWhileItsServerDrainsGetsItsReplyAndANewCallIsRefused) {
  auto b = blockerVia(proxy);
  auto first = hold(b, "a");
  await(loop, blocker.whenStarted(1));
  auto drained = server->drain(30 * kj::SECONDS);
  // b never reaches the server: the connection is cut before it, and both calls go again on a
  // new one. The draining server answers the returning caller's lookup; a attaches to the call
  // still running, and b, new to the server, is refused.
  auto rule = proxy.addRule({.match = onceCall()});
  auto second = hold(b, "b");
  auto refused = awaitError(loop, kj::mv(second));
  EXPECT_EQ(refused.code, ErrorCode::DRAINING) << refused.text;
  EXPECT_EQ(proxy.cutsBy(rule), 1u);
  EXPECT_TRUE(blocker.release("a"));
  EXPECT_EQ(kj::StringPtr(await(loop, kj::mv(first)).getTag()), "a");
  EXPECT_EQ(replies(*server, "troupe_server_replies_replayed_total"), 1);
  EXPECT_EQ(blocker.started, 1u);
  await(loop, kj::mv(drained));
}

TEST_F(ExactlyOnceTest, ACallWhoseCallerDoesNotComeBackIsCancelledAfterTheReconnectWindow) {
  BlockerState state;
  kj::Own<ActorServer> own;
  ActorServerOptions options;
  options.replies.reconnectWindow = 100 * kj::MILLISECONDS;
  auto at = startServer(own, options, state);
  auto via = kj::heap<FaultProxy>(loop, at);
  auto b = blockerVia(*via);
  auto held = hold(b, "a");
  await(loop, state.whenStarted(1));
  // Nothing listens where the caller connected any more: it gives up, the call runs on.
  via = nullptr;
  auto failure = awaitError(loop, kj::mv(held));
  EXPECT_EQ(failure.code, ErrorCode::MAY_HAVE_RUN) << failure.text;
  // With no retry within the window, the server cancels the call.
  await(loop, state.whenCancelled(1));
  EXPECT_EQ(state.finished, 0u);
  EXPECT_EQ(replies(*own, "troupe_server_replies_running"), 0);
}

TEST_F(ExactlyOnceTest, AReplyTooLargeToKeepReachesItsCallerButNotARetry) {
  JobContext job;
  ActorServerOptions options;
  options.replies.maxReplyBytes = 512;
  ActorServer small(loop, job, options);
  small.host<Echo>("echo", kj::heap<EchoImpl>());
  FaultProxy via(loop, small.listen("tcp://127.0.0.1:0"));
  auto echo = ActorRef<Echo>::connect(loop, via.address().c_str(), "echo");
  auto echoOf = [&](size_t bytes) {
    return echo.call([bytes](Echo::Client c) {
      auto q = c.echoRequest();
      q.initPayload(bytes);
      return q.send();
    });
  };
  EXPECT_EQ(await(loop, echoOf(4096)).getPayload().size(), 4096u);
  via.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY});
  auto failure = awaitError(loop, echoOf(4096));
  EXPECT_EQ(failure.code, ErrorCode::MAY_HAVE_RUN) << failure.text;
  EXPECT_TRUE(failure.mentions("the call ran, but its reply of")) << failure.text;
  // A small reply is kept as ever.
  via.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY});
  EXPECT_EQ(await(loop, echoOf(64)).getPayload().size(), 64u);
}

// A large reply is kept in the message that carried it, not copied: the retry reads it there
// after that message's connection is gone.
TEST_F(ExactlyOnceTest, ALargeReplyKeptWhereItWasSentReachesARetryWholeAfterItsConnectionIsGone) {
  JobContext job;
  ActorServer echoServer(loop, job);
  echoServer.host<Echo>("echo", kj::heap<EchoImpl>());
  FaultProxy via(loop, echoServer.listen("tcp://127.0.0.1:0"));
  auto echo = ActorRef<Echo>::connect(loop, via.address().c_str(), "echo");
  constexpr size_t BYTES = 1 << 20;
  auto pattern = kj::heapArray<kj::byte>(BYTES);
  for (size_t i = 0; i < BYTES; ++i) pattern[i] = kj::byte(i * 7 + i / 4096);
  auto echoPattern = [&]() {
    return echo.call([&](Echo::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{BYTES / sizeof(capnp::word) + 16, 0});
      q.setPayload(pattern);
      return q.send();
    });
  };
  EXPECT_EQ(await(loop, echoPattern()).getPayload(), pattern);
  // Cut after a quarter of the reply has left: the retry comes on a new connection.
  auto rule = via.addRule({.direction = Direction::SERVER_TO_CLIENT,
                           .match = messageIs(Which::RETURN),
                           .point = CutPoint::INSIDE,
                           .bytesInside = BYTES / 4,
                           .kind = CutKind::RESET});
  auto reply = await(loop, echoPattern());
  EXPECT_EQ(via.cutsBy(rule), 1u);
  EXPECT_TRUE(reply.getPayload() == pattern) << "the replayed reply differs from the one sent";
  auto kept = [&](kj::StringPtr name) {
    return echoServer.metrics().value(name, {{"job", "local"}});
  };
  EXPECT_EQ(kept("troupe_server_replies_replayed_total"), 1);
  // Counted at what the message holds: the reply and little more.
  EXPECT_GE(kept("troupe_server_reply_bytes"), BYTES);
  EXPECT_LT(kept("troupe_server_reply_bytes"), 2 * BYTES + 64 * 1024);
}

TEST_F(ExactlyOnceTest, ACallPipelinedOnTheResultsOfOneSentOnceReachesTheCapabilityInThem) {
  JobContext job;
  ActorServer members(loop, job);
  members.host<Member>("member", kj::heap<MemberImpl>("m-0"), {.maxConcurrency = 0});
  auto member = ActorRef<Member>::connect(loop, members.listen("tcp://127.0.0.1:0").c_str(),
                                          "member");
  // Sent before `self` answers (at the next `calls`): the server holds it until the reply is
  // there.
  auto pipelined = member.call(
      [](Member::Client c) { return c.selfRequest().send().getMember().whoamiRequest().send(); });
  auto release = member.call([](Member::Client c) { return c.callsRequest().send(); });
  EXPECT_EQ(await(loop, kj::mv(release)).getCount(), 0u);
  EXPECT_EQ(await(loop, kj::mv(pipelined)).getName(), "m-0");
}

TEST_F(ExactlyOnceTest, ARetryThatFindsAnotherServerAtTheAddressEndsWithMayHaveRun) {
  BlockerState state;
  kj::Own<ActorServer> own;
  auto at = startServer(own, {}, state);
  auto b = ActorRef<Blocker>::connect(loop, at.c_str(), "blocker");
  auto held = hold(b, "a");
  await(loop, state.whenStarted(1));
  // The server goes, and another one, without the actor, takes its address at once: the retry's
  // lookup fails there, which says nothing of whether the call ran.
  own = nullptr;
  ActorServer other(loop, JobContext(), {});
  other.host<Echo>("echo", kj::heap<EchoImpl>());
  other.listen(at);
  auto failure = awaitError(loop, kj::mv(held));
  EXPECT_EQ(failure.code, ErrorCode::MAY_HAVE_RUN) << failure.text;
}

TEST_F(ExactlyOnceTest, AConnectionThatKeepsBreakingEndsTheCallWithMayHaveRunAfterOneRun) {
  auto calc = calcVia(proxy);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  proxy.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY, .everyConnection = true});
  auto failure = awaitError(loop, add(calc, 20, 22));
  EXPECT_EQ(failure.code, ErrorCode::MAY_HAVE_RUN) << failure.text;
  EXPECT_TRUE(failure.mentions("8 tries to send it again failed")) << failure.text;
  EXPECT_EQ(addsStarted(*server), 2);
}

TEST_F(ExactlyOnceTest, ACallWhoseServerRestartedUnderItFailsWithMayHaveRun) {
  BlockerState first;
  kj::Own<ActorServer> own;
  auto at = startServer(own, {}, first);
  FaultProxy via(loop, at);
  auto b = blockerVia(via);
  auto held = hold(b, "a");
  await(loop, first.whenStarted(1));
  // Another process at the same address: a new incarnation, which never saw the call.
  own = nullptr;
  BlockerState second;
  startServer(own, {}, second, at);
  auto failure = awaitError(loop, kj::mv(held));
  EXPECT_EQ(failure.code, ErrorCode::MAY_HAVE_RUN) << failure.text;
  EXPECT_TRUE(failure.mentions("restarted")) << failure.text;
  EXPECT_EQ(second.started, 0u);
  // The handle goes on with the new server.
  auto next = hold(b, "b");
  await(loop, second.whenStarted(1));
  EXPECT_TRUE(second.release("b"));
  EXPECT_EQ(kj::StringPtr(await(loop, kj::mv(next)).getTag()), "b");
}

TEST_F(ExactlyOnceTest, AServerThatKeepsNoRepliesAnswersARetryWithMayHaveRun) {
  BlockerState unused;
  kj::Own<ActorServer> own;
  ActorServerOptions options;
  options.replies.enabled = false;
  FaultProxy via(loop, startServer(own, options, unused));
  auto calc = calcVia(via);
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  via.addRule({.match = onceCall(), .point = CutPoint::BEFORE_REPLY});
  auto failure = awaitError(loop, add(calc, 20, 22));
  EXPECT_EQ(failure.code, ErrorCode::MAY_HAVE_RUN) << failure.text;
  EXPECT_TRUE(failure.mentions("keeps no replies")) << failure.text;
  EXPECT_EQ(addsStarted(*own), 2);
  EXPECT_EQ(replies(*own, "troupe_server_replies_forgotten_total"), 1);
}

TEST_F(ExactlyOnceTest, RepliesDroppedForTheBoundsAnswerTheirRetriesWithMayHaveRun) {
  BlockerState state;
  kj::Own<ActorServer> own;
  ActorServerOptions options;
  options.replies.maxRepliesPerCaller = 1;
  FaultProxy via(loop, startServer(own, options, state));
  auto b = blockerVia(via);
  auto a1 = hold(b, "a");
  auto a2 = hold(b, "b");
  auto a3 = hold(b, "c");
  await(loop, state.whenStarted(3));
  // All three finish; the first reply to leave cuts the connection, so all three are retried.
  via.addRule({.direction = Direction::SERVER_TO_CLIENT, .match = messageIs(Which::RETURN)});
  for (auto tag : {"a", "b", "c"}) EXPECT_TRUE(state.release(tag));
  // The server kept one reply, the last; the other two may have run, and did not run again.
  EXPECT_EQ(awaitError(loop, kj::mv(a1)).code, ErrorCode::MAY_HAVE_RUN);
  EXPECT_EQ(awaitError(loop, kj::mv(a2)).code, ErrorCode::MAY_HAVE_RUN);
  EXPECT_EQ(kj::StringPtr(await(loop, kj::mv(a3)).getTag()), "c");
  EXPECT_EQ(state.started, 3u);
  EXPECT_EQ(replies(*own, "troupe_server_replies_forgotten_total"), 2);
}

TEST_F(ExactlyOnceTest, AcknowledgedRepliesAreDroppedWithTheCallersNextCall) {
  auto calc = ref<Calculator>("calc");
  for (int i = 0; i < 50; ++i) EXPECT_EQ(await(loop, add(calc, i, 1)), i + 1);
  // Each call acknowledges the replies before it: only the last is kept.
  EXPECT_EQ(replies(*server, "troupe_server_replies_kept"), 1);
  EXPECT_EQ(replies(*server, "troupe_server_reply_callers"), 1);
  EXPECT_GT(replies(*server, "troupe_server_reply_bytes"), 0);
  EXPECT_EQ(replies(*server, "troupe_server_replies_running"), 0);
}

TEST_F(ExactlyOnceTest, IdempotentCallsAndHandlesWithExactlyOnceOffTravelAsPlainCalls) {
  auto plain = ActorRef<Calculator>::connect(loop, proxy.address().c_str(), "calc",
                                             {.exactlyOnce = false});
  EXPECT_EQ(await(loop, add(plain, 1, 2)), 3);
  auto calc = calcVia(proxy);
  auto sum = calc.call(
      [](Calculator::Client c) {
        auto r = c.addRequest();
        r.setA(2);
        r.setB(3);
        return r.send();
      },
      {.idempotent = true});
  EXPECT_EQ(await(loop, kj::mv(sum)).getSum(), 5);
  // Only the handle that may send calls to run once introduced itself; nothing was kept.
  EXPECT_EQ(replies(*server, "troupe_server_reply_callers"), 1);
  EXPECT_EQ(replies(*server, "troupe_server_replies_kept"), 0);
  // A plain call cut after it arrived is in doubt, as before.
  proxy.addRule({.match = callTo<Calculator>(0), .point = CutPoint::BEFORE_REPLY});
  EXPECT_EQ(awaitError(loop, add(plain, 20, 22)).code, ErrorCode::DISCONNECTED);
}

TEST_F(ExactlyOnceTest, CancellingACallCancelsItOnTheServerAsBefore) {
  auto b = blockerVia(proxy);
  {
    auto held = hold(b, "a");
    await(loop, blocker.whenStarted(1));
  }
  await(loop, blocker.whenCancelled(1));
  auto failure = awaitError(loop, hold(b, "late", {.deadline = 50 * kj::MILLISECONDS}));
  EXPECT_EQ(failure.code, ErrorCode::DEADLINE_EXCEEDED) << failure.text;
  await(loop, blocker.whenCancelled(2));
  EXPECT_EQ(blocker.finished, 0u);
}

}  // namespace
}  // namespace troupe::test
