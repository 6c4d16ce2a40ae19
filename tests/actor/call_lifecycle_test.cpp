// How calls start, queue, get cancelled, time out and drain.

#include <signal.h>

#include <gtest/gtest.h>

#include "tests/support/server_fixture.h"

namespace troupe {
namespace {

using test::Blocker;
using test::Echo;

// On a manual clock: a deadline or grace period ends when the test moves time past it.
class CallLifecycleTest : public test::ServerFixture {
protected:
  CallLifecycleTest() : ServerFixture({.manualClock = true}) {}

  // How `call` fails, moving time on while it waits: a call not marked idempotent whose
  // connection broke connects again, with a backoff, before it gives up on a server that is gone.
  template <typename T>
  kj::Exception failureOf(kj::Promise<T>& call) {
    while (!call.poll(ws())) loop.advanceTime(100 * kj::MILLISECONDS);
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { call.wait(ws()); })) {
      return kj::mv(*e);
    }
    ADD_FAILURE() << "the call succeeded";
    return KJ_EXCEPTION(FAILED, "the call succeeded");
  }
};

TEST_F(CallLifecycleTest, CallsToOneActorRunOneAtATimeByDefault) {
  auto s = ref<Blocker>("serial");
  auto first = hold(s, "first");
  auto second = hold(s, "second");
  serial.whenStarted(1).wait(ws());
  // The second call arrives and waits for the first.
  ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 2; }));
  EXPECT_EQ(serial.started, 1u);
  ASSERT_TRUE(serial.release("first"));
  EXPECT_EQ(kj::StringPtr(first.wait(ws()).getTag()), "first");
  serial.whenStarted(2).wait(ws());
  ASSERT_TRUE(serial.release("second"));
  EXPECT_EQ(kj::StringPtr(second.wait(ws()).getTag()), "second");
  EXPECT_EQ(serial.maxConcurrent, 1u);
}

TEST_F(CallLifecycleTest, ACallPastTheQueueBoundIsRefusedBeforeItRunsAndTheQueueMovesOn) {
  test::BlockerState state;
  server->host<Blocker>("bounded", kj::heap<test::BlockerImpl>(state), {.maxQueued = 2});
  auto b = ref<Blocker>("bounded");
  auto a = hold(b, "a");
  auto queued1 = hold(b, "b");
  auto queued2 = hold(b, "c");
  state.whenStarted(1).wait(ws());
  ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 3; }));

  auto refused = hold(b, "d");
  try {
    refused.wait(ws());
    FAIL() << "a call past the queue's bound was taken";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::QUEUE_FULL) << e.getDescription().cStr();
    EXPECT_EQ(e.getType(), kj::Exception::Type::OVERLOADED);
    EXPECT_FALSE(raisedByActor(e));
  }
  EXPECT_EQ(server->callsInFlight(), 3u);  // the refused call holds nothing

  // A place frees: the queue moves on and takes a call again.
  ASSERT_TRUE(state.release("a"));
  a.wait(ws());
  state.whenStarted(2).wait(ws());
  auto e = hold(b, "e");
  ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 3; }));
  for (auto [tag, promise] : {std::pair{"b", &queued1}, {"c", &queued2}, {"e", &e}}) {
    ASSERT_TRUE(pollUntil([&, tag = tag]() { return state.held.count(tag) == 1; })) << tag;
    ASSERT_TRUE(state.release(tag));
    EXPECT_EQ(kj::StringPtr(promise->wait(ws()).getTag()), tag);
  }
  EXPECT_EQ(state.started, 4u);  // a, b, c and e; never d
}

TEST_F(CallLifecycleTest, AnActorMayAllowConcurrentCalls) {
  auto b = ref<Blocker>("blocker");
  auto first = hold(b, "a");
  auto second = hold(b, "b");
  blocker.whenStarted(2).wait(ws());
  EXPECT_EQ(blocker.maxConcurrent, 2u);
  blocker.release("b");
  blocker.release("a");
  EXPECT_EQ(kj::StringPtr(second.wait(ws()).getTag()), "b");
  EXPECT_EQ(kj::StringPtr(first.wait(ws()).getTag()), "a");
}

TEST_F(CallLifecycleTest, DroppingTheCallCancelsItOnTheServer) {
  auto b = ref<Blocker>("blocker");
  {
    auto p = hold(b, "dropped");
    blocker.whenStarted(1).wait(ws());
  }
  blocker.whenCancelled(1).wait(ws());
  EXPECT_EQ(blocker.cancelled, 1u);
  EXPECT_EQ(blocker.finished, 0u);
  EXPECT_EQ(blocker.held.count("dropped"), 0u);
}

TEST_F(CallLifecycleTest, ACancelledQueuedCallNeverStartsAndFreesItsPlace) {
  auto s = ref<Blocker>("serial");
  auto first = hold(s, "first");
  serial.whenStarted(1).wait(ws());
  {
    auto queued = hold(s, "queued");
    ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 2; }));
  }
  ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 1; }));
  auto third = hold(s, "third");
  serial.release("first");
  first.wait(ws());
  serial.whenStarted(2).wait(ws());
  EXPECT_EQ(serial.held.count("third"), 1u);
  EXPECT_EQ(serial.held.count("queued"), 0u);
  serial.release("third");
  third.wait(ws());
  EXPECT_EQ(serial.started, 2u);
}

TEST_F(CallLifecycleTest, DeadlineExceededCancelsTheCall) {
  auto b = ref<Blocker>("blocker");
  auto call = hold(b, "slow", {.deadline = 30 * kj::MILLISECONDS});
  blocker.whenStarted(1).wait(ws());
  loop.advanceTime(30 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(call.poll(ws())) << "the call ended before its deadline";
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(call.poll(ws())) << "the deadline did not end the call";
  try {
    call.wait(ws());
    FAIL() << "the call should time out";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED) << e.getDescription().cStr();
    EXPECT_FALSE(callNeverRan(errorCode(e)));
  }
  blocker.whenCancelled(1).wait(ws());
  EXPECT_EQ(blocker.started, 1u);
}

TEST_F(CallLifecycleTest, DefaultDeadlineApplies) {
  auto b = ActorRef<Blocker>::connect(loop, address.c_str(), "blocker",
                                      {.defaultDeadline = 20 * kj::MILLISECONDS});
  auto p = hold(b, "slow");
  blocker.whenStarted(1).wait(ws());
  loop.advanceTime(20 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(p.poll(ws())) << "the call ended before its deadline";
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(p.poll(ws())) << "the deadline did not end the call";
  try {
    p.wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED);
  }
}

// A listener hears of the endpoints while its registration lives: at once of those the server
// has, then of changes; once the registration is dropped (or moved into one that is), no more.
TEST_F(CallLifecycleTest, AnEndpointListenerIsToldWhileItsRegistrationLives) {
  test::RecordingListener told, dropped;
  auto listening = server->addEndpointListener(told);
  {
    auto first = server->addEndpointListener(dropped);
    auto moved = kj::mv(first);
    EXPECT_EQ(dropped.events.size(), server->endpoints().size());
  }
  auto heard = dropped.events.size();
  ASSERT_GT(heard, 0u);
  size_t before = told.events.size();
  EXPECT_EQ(before, heard);
  server->drain().wait(ws());
  EXPECT_GT(told.events.size(), before);  // draining, then removed
  EXPECT_EQ(dropped.events.size(), heard);
}

TEST_F(CallLifecycleTest, DrainFinishesInFlightCallsAndRefusesNewOnes) {
  test::RecordingListener listener;
  auto listening = server->addEndpointListener(listener);
  auto b = ref<Blocker>("blocker");
  auto echo = ref<Echo>("echo");
  echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());

  auto inFlight = hold(b, "in-flight");
  blocker.whenStarted(1).wait(ws());
  auto drained = server->drain();
  EXPECT_EQ(server->state(), ServerState::DRAINING);

  // A new call is refused, with an error that says it never ran.
  try {
    echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
    FAIL() << "a call during drain must be refused";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DRAINING) << e.getDescription().cStr();
    EXPECT_EQ(e.getType(), kj::Exception::Type::OVERLOADED);
    EXPECT_TRUE(callNeverRan(errorCode(e)));
  }
  // A new client asking for an actor is refused the same way.
  auto late = ref<Echo>("echo");
  try {
    late.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DRAINING) << e.getDescription().cStr();
  }

  // The call in flight completes and its reply arrives.
  blocker.release("in-flight");
  EXPECT_EQ(kj::StringPtr(inFlight.wait(ws()).getTag()), "in-flight");
  drained.wait(ws());
  EXPECT_EQ(server->state(), ServerState::STOPPED);
  EXPECT_EQ(blocker.finished, 1u);

  auto events = kj::strArray(listener.events, "; ");
  EXPECT_NE(strstr(events.cStr(), "job-1/blocker-3 ready"), nullptr) << events.cStr();
  EXPECT_NE(strstr(events.cStr(), "job-1/blocker-3 draining"), nullptr) << events.cStr();
  EXPECT_NE(strstr(events.cStr(), "job-1/blocker-3 removed"), nullptr) << events.cStr();
  EXPECT_EQ(server->endpoints().size(), 0u);

  // After the stop nothing listens.
  auto after = ref<Echo>("echo");
  try {
    after.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::UNREACHABLE) << e.getDescription().cStr();
  }
}

TEST_F(CallLifecycleTest, DrainClosesCallsThatOutliveTheGracePeriod) {
  auto b = ref<Blocker>("blocker");
  auto stuck = hold(b, "stuck");
  blocker.whenStarted(1).wait(ws());
  auto drained = server->drain(20 * kj::MILLISECONDS);
  loop.advanceTime(20 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(drained.poll(ws())) << "the drain ended before its grace period";
  EXPECT_EQ(server->state(), ServerState::DRAINING);
  EXPECT_EQ(blocker.cancelled, 0u);
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(drained.poll(ws())) << "the grace period did not end the drain";
  drained.wait(ws());
  EXPECT_EQ(server->state(), ServerState::STOPPED);
  EXPECT_EQ(blocker.cancelled, 1u);
  // Its connection closed, the call tries the address again; nothing listens there any more.
  auto e = failureOf(stuck);
  EXPECT_EQ(errorCode(e), ErrorCode::MAY_HAVE_RUN) << e.getDescription().cStr();
  EXPECT_FALSE(callNeverRan(errorCode(e)));
}

TEST_F(CallLifecycleTest, DestroyingTheServerEndsItsCallsAtOnce) {
  auto b = ref<Blocker>("blocker");
  auto stuck = hold(b, "stuck");
  blocker.whenStarted(1).wait(ws());
  server = nullptr;
  // The call's work is gone before the destructor returns, not on some later turn.
  EXPECT_EQ(blocker.cancelled, 1u);
  EXPECT_EQ(blocker.running, 0u);
  auto e = failureOf(stuck);
  EXPECT_EQ(errorCode(e), ErrorCode::MAY_HAVE_RUN) << e.getDescription().cStr();
}

TEST_F(CallLifecycleTest, DrainWritesALargeReplyWholeBeforeItCloses) {
  // 48 MiB cannot leave in one write: the drain must wait for the socket, not only for the call.
  constexpr uint64_t BYTES = 48 << 20;
  auto b = ref<Blocker>("blocker");
  auto inFlight = b.call([](Blocker::Client c) {
    auto r = c.holdRequest();
    r.setTag("large");
    r.setReplyBytes(BYTES);
    return r.send();
  });
  blocker.whenStarted(1).wait(ws());
  auto drained = server->drain();
  blocker.release("large");
  auto reply = inFlight.wait(ws());
  auto payload = reply.getPayload();
  ASSERT_EQ(payload.size(), BYTES);
  for (uint64_t i = 0; i < BYTES; i += 4093) ASSERT_EQ(payload[i], i % 251) << i;
  drained.wait(ws());
  EXPECT_EQ(server->state(), ServerState::STOPPED);
}

TEST_F(CallLifecycleTest, ASigtermDuringADrainJoinsItInsteadOfKillingTheProcess) {
  auto served = server->serve();
  auto b = ref<Blocker>("blocker");
  auto held = hold(b, "busy");
  blocker.whenStarted(1).wait(ws());
  auto drained = server->drain();
  // A launcher's SIGTERM arriving now must not kill the process (it would end this test).
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  auto echo = ref<Echo>("echo");
  try {
    echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DRAINING);
  }
  blocker.release("busy");
  EXPECT_EQ(kj::StringPtr(held.wait(ws()).getTag()), "busy");
  drained.wait(ws());
  served.wait(ws());
  EXPECT_EQ(server->state(), ServerState::STOPPED);
}

TEST_F(CallLifecycleTest, ACapabilityOutlivingItsRefFailsCleanly) {
  // Nothing listens here; the connection attempt is still under way when the ref goes.
  uint port;
  {
    auto l = loop.network().parseAddress("127.0.0.1", 0).wait(ws())->listen();
    port = l->getPort();
  }
  kj::Promise<capnp::Response<Echo::WhoamiResults>> call = nullptr;
  {
    auto echo = ActorRef<Echo>::connect(loop, kj::str("tcp://127.0.0.1:", port), "echo");
    call = echo.client().whoamiRequest().send();
  }
  try {
    call.wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::UNREACHABLE) << e.getDescription().cStr();
  }
}

std::shared_ptr<Credentials> jobCredentials(std::string jobToken) {
  return std::make_shared<Credentials>(
      CredentialsOptions{.jobId = "job-1", .jobToken = kj::mv(jobToken)});
}

// A drain request from a channel with `credentials`; what the server answered.
kj::Promise<void> askToDrain(EventLoop& loop, const std::string& address,
                             std::shared_ptr<Credentials> credentials) {
  auto channel = Channel::open(loop, address.c_str(), {.credentials = kj::mv(credentials)});
  auto request = channel->host().drainRequest();
  request.setGraceMillis(1000);
  request.setJobCredential(channel->credentials().jobTokenFor("job-1"));
  return request.send().ignoreResult().attach(kj::mv(channel));
}

TEST_F(CallLifecycleTest, APeerWithTheJobCredentialCanAskTheServerToDrain) {
  ActorServer owned(loop, server->job(), {.credentials = jobCredentials("job-secret")});
  auto at = owned.listen("tcp://127.0.0.1:0");
  auto served = owned.serve();
  askToDrain(loop, at, jobCredentials("job-secret")).wait(ws());
  served.wait(ws());
  EXPECT_EQ(owned.state(), ServerState::STOPPED);
}

TEST_F(CallLifecycleTest, ADrainRequestWithoutTheJobCredentialIsRefused) {
  ActorServer owned(loop, server->job(), {.credentials = jobCredentials("job-secret")});
  auto at = owned.listen("tcp://127.0.0.1:0");
  struct Case {
    const char* presented;
    const char* answer;
  };
  for (auto c : {Case{"", "none was presented"}, Case{"not-it", "a wrong one was presented"}}) {
    try {
      askToDrain(loop, at, jobCredentials(c.presented)).wait(ws());
      ADD_FAILURE() << "a drain with '" << c.presented << "' was taken";
    } catch (const kj::Exception& e) {
      EXPECT_EQ(errorCode(e), ErrorCode::PERMISSION_DENIED) << e.getDescription().cStr();
      EXPECT_TRUE(kj::StringPtr(e.getDescription())
                      .endsWith(kj::str("draining a server of job 'job-1' needs the job's "
                                        "credential, and ",
                                        c.answer)))
          << e.getDescription().cStr();
    }
  }
  EXPECT_EQ(owned.state(), ServerState::SERVING);
  // A server that has no job credential takes no drain request at all.
  try {
    askToDrain(loop, address, jobCredentials("")).wait(ws());
    ADD_FAILURE() << "the fixture's server drained";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::PERMISSION_DENIED) << e.getDescription().cStr();
  }
  EXPECT_EQ(server->state(), ServerState::SERVING);
}

TEST_F(CallLifecycleTest, ServeStopsOnSigterm) {
  auto served = server->serve();
  auto echo = ref<Echo>("echo");
  echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  served.wait(ws());
  EXPECT_EQ(server->state(), ServerState::STOPPED);
}

volatile sig_atomic_t sigintSeen = 0;

TEST_F(CallLifecycleTest, ServeCatchingOnlySigtermLeavesSigintToTheProgram) {
  struct sigaction mine {
  }, saved{};
  mine.sa_handler = [](int) { sigintSeen = 1; };
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(::sigaction(SIGINT, &mine, &saved), 0);
  KJ_DEFER(::sigaction(SIGINT, &saved, nullptr));
  sigintSeen = 0;
  auto served = server->serve({SIGTERM});
  // raise() delivers it to this thread before it returns.
  ASSERT_EQ(::raise(SIGINT), 0);
  EXPECT_EQ(sigintSeen, 1);
  auto echo = ref<Echo>("echo");
  echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  EXPECT_EQ(server->state(), ServerState::SERVING);
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  served.wait(ws());
  EXPECT_EQ(server->state(), ServerState::STOPPED);
}

}  // namespace
}  // namespace troupe
