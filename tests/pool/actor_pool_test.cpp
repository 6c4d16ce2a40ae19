// ActorGroup and ActorPool over in-process replicas: several ActorServers on one loop, each
// publishing its endpoints in a FixedResolver, reached over real sockets on port 0.

#include "troupe/pool/actor_pool.h"

#include <set>
#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "troupe/resolver/fixed_resolver.h"
#include "tests/support/pool_replica.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::Blocker;
using test::BlockerState;
using test::Member;

using Replica = test::PoolReplica;

class ActorPoolTest : public ::testing::Test {
protected:
  // `credentials`: the loop's, when not null.
  explicit ActorPoolTest(EventLoopOptions loopOptions = {},
                         std::shared_ptr<Credentials> credentials = nullptr)
      : loop(kj::mv(loopOptions)) {
    if (credentials) setLoopCredentials(loop, kj::mv(credentials));
  }
  ~ActorPoolTest() noexcept override {}

  void startReplicas(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) replicas.add(kj::heap<Replica>(loop, resolver, i));
  }

  kj::WaitScope& ws() { return loop.waitScope(); }

  static kj::Promise<std::string> whoami(ActorPool<Member>& pool, CallOptions options = {}) {
    return pool.call([](Member::Client c) { return c.whoamiRequest().send(); }, options)
        .then([](auto r) { return std::string(r.getName().cStr()); });
  }

  EventLoop loop;
  FixedResolver resolver;
  kj::Vector<kj::Own<Replica>> replicas;
};

// The same on a manual clock, for what a deadline or timeout ends: it ends when the test moves
// time past it.
class ActorPoolClockTest : public ActorPoolTest {
protected:
  ActorPoolClockTest() : ActorPoolTest({.manualClock = true}) {}

  // Moves the clock to a nanosecond short of `duration`, checks that `promise` is still pending,
  // then to `duration` and checks that it has settled.
  template <typename T>
  void expireAt(kj::Duration duration, kj::Promise<T>& promise) {
    loop.advanceTime(duration - 1 * kj::NANOSECONDS);
    EXPECT_FALSE(promise.poll(ws())) << "settled before its time";
    loop.advanceTime(1 * kj::NANOSECONDS);
    ASSERT_TRUE(promise.poll(ws())) << "still pending at its time";
  }
};

TEST_F(ActorPoolTest, RoundRobinVisitsMembersInNameOrder) {
  startReplicas(3);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto ready = group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_EQ(ready[0].name, "job-1/member-0");
  ActorPool<Member> pool(group);
  kj::Vector<kj::String> order;
  for (int i = 0; i < 6; ++i) order.add(kj::str(whoami(pool).wait(ws()).c_str()));
  EXPECT_EQ(kj::strArray(order, ","), "job-1/member-0,job-1/member-1,job-1/member-2,"
                                      "job-1/member-0,job-1/member-1,job-1/member-2");
}

TEST_F(ActorPoolTest, BroadcastReturnsOneResultPerMember) {
  startReplicas(3);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto results = pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); })
                     .waitAll(5 * kj::SECONDS)
                     .wait(ws());
  ASSERT_EQ(results.size(), 3u);
  for (uint i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok());
    auto expected = kj::str("job-1/member-", i);
    EXPECT_EQ(results[i].endpoint.name, expected.cStr());
    EXPECT_EQ(kj::StringPtr(KJ_ASSERT_NONNULL(results[i].value).getName()), expected);
    EXPECT_GT(results[i].latency, 0 * kj::NANOSECONDS);
  }
}

TEST_F(ActorPoolTest, BroadcastReportsAnUnreachableMemberBesideTheOthers) {
  startReplicas(2);
  // A member the resolver still lists though nothing listens at its address any more.
  uint port;
  {
    auto l = loop.network().parseAddress("127.0.0.1", 0).wait(ws())->listen();
    port = l->getPort();
  }
  Endpoint gone;
  gone.name = "job-1/member-7";
  gone.address = kj::str("tcp://127.0.0.1:", port).cStr();
  gone.state = EndpointState::READY;
  resolver.add(gone);

  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto results = pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); })
                     .waitAll(5 * kj::SECONDS)
                     .wait(ws());
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_TRUE(results[1].ok());
  EXPECT_FALSE(results[2].ok());
  EXPECT_EQ(results[2].endpoint.name, "job-1/member-7");
  auto& e = KJ_ASSERT_NONNULL(results[2].error);
  EXPECT_EQ(e.getType(), kj::Exception::Type::DISCONNECTED) << e.getDescription().cStr();
}

TEST_F(ActorPoolClockTest, WaitAllReturnsAtTheDeadlineWithTheSlowMemberMarked) {
  startReplicas(3);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ActorPool<Blocker> pool(group);
  // Member 1 holds its call; the others are released as soon as they start.
  replicas[0]
      ->blocker.whenStarted(1)
      .then([&]() { replicas[0]->blocker.release("t"); })
      .detach([](kj::Exception&&) {});
  replicas[2]
      ->blocker.whenStarted(1)
      .then([&]() { replicas[2]->blocker.release("t"); })
      .detach([](kj::Exception&&) {});
  auto all = pool.broadcast([](Blocker::Client c) {
                   auto q = c.holdRequest();
                   q.setTag("t");
                   return q.send();
                 })
                 .waitAll(100 * kj::MILLISECONDS);
  replicas[1]->blocker.whenStarted(1).wait(ws());
  ASSERT_NO_FATAL_FAILURE(expireAt(100 * kj::MILLISECONDS, all));
  auto results = all.wait(ws());
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_TRUE(results[2].ok());
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(results[1].error)), ErrorCode::DEADLINE_EXCEEDED);
  // The slow call was cancelled on its member.
  replicas[1]->blocker.whenCancelled(1).wait(ws());
}

TEST_F(ActorPoolTest, WaitAnyAndQuorumAndNext) {
  startReplicas(3);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto whoamiAll = [&]() {
    return pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); });
  };
  auto any = whoamiAll().waitAny().wait(ws());
  EXPECT_TRUE(any.ok());

  auto quorum = whoamiAll().waitQuorum(2, 5 * kj::SECONDS).wait(ws());
  EXPECT_EQ(quorum.size(), 2u);

  auto stream = whoamiAll();
  size_t seen = 0;
  for (;;) {
    auto next = stream.next().wait(ws());
    if (next == nullptr) break;
    EXPECT_TRUE(KJ_ASSERT_NONNULL(next).ok());
    ++seen;
  }
  EXPECT_EQ(seen, 3u);

  // A quorum that cannot be met fails as soon as that is certain.
  auto failing = pool.broadcast([](Member::Client c) {
    auto q = c.raiseRequest();
    q.setMessage("nope");
    return q.send();
  });
  try {
    kj::mv(failing).waitQuorum(1, 5 * kj::SECONDS).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_NE(strstr(e.getDescription().cStr(), "cannot be reached"), nullptr)
        << e.getDescription().cStr();
  }
}

TEST_F(ActorPoolTest, WaitReadyThenDiscoverNewHandsOutTheRest) {
  startReplicas(5);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto first = group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ASSERT_EQ(first.size(), 2u);
  while (group.readyCount() < 5) group.whenChanged().wait(ws());
  auto rest = group.discoverNew();
  ASSERT_EQ(rest.size(), 3u);
  std::set<std::string> names;
  for (auto& e : first) names.insert(e.name);
  for (auto& e : rest) names.insert(e.name);
  EXPECT_EQ(names.size(), 5u);
  EXPECT_EQ(group.discoverNew().size(), 0u);
  // A replica that comes later is new.
  replicas.add(kj::heap<Replica>(loop, resolver, 5));
  while (group.readyCount() < 6) group.whenChanged().wait(ws());
  auto later = group.discoverNew();
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].name, "job-1/member-5");
}

TEST_F(ActorPoolTest, WaitReadyFailsAtOnceWhenTheJobEnds) {
  startReplicas(1);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto waiting = group.waitReady(4, 60 * kj::SECONDS);
  resolver.setJobStatus({"job-1", JobState::ENDED, "replica 2 exited with status 1"}).wait(ws());
  try {
    waiting.wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::JOB_ENDED) << e.getDescription().cStr();
    EXPECT_NE(strstr(e.getDescription().cStr(), "replica 2 exited"), nullptr);
  }
  // And for a group made after the end.
  ActorGroup<Member> late(loop, resolver, "job-1", "member");
  try {
    late.waitReady(1, 60 * kj::SECONDS).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::JOB_ENDED) << e.getDescription().cStr();
  }
}

TEST_F(ActorPoolClockTest, WaitReadyTimesOutSayingWhoIsReady) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto waiting = group.waitReady(3, 50 * kj::MILLISECONDS);
  ASSERT_NO_FATAL_FAILURE(expireAt(50 * kj::MILLISECONDS, waiting));
  try {
    waiting.wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED) << e.getDescription().cStr();
    EXPECT_NE(strstr(e.getDescription().cStr(), "only 2 of the 3"), nullptr)
        << e.getDescription().cStr();
  }
}

TEST_F(ActorPoolTest, AnActorsExceptionIsNeverRetried) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  try {
    pool.call(
            [](Member::Client c) {
              auto q = c.raiseRequest();
              q.setMessage("bad batch");
              return q.send();
            },
            {.idempotent = true})
        .wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::FAILED);
    EXPECT_NE(strstr(e.getDescription().cStr(), "bad batch"), nullptr);
  }
  EXPECT_EQ(replicas[0]->member->count + replicas[1]->member->count, 1u);
}

// An actor's own error does not say which member raised it; callResult() does, as it does for
// an answer.
TEST_F(ActorPoolTest, ARequestTooLargeForAnyMessageFailsBeforeItIsSentAndTheMemberStaysIn) {
  startReplicas(1);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(1, 10 * kj::SECONDS).wait(ws());
  ActorPool<Blocker> pool(group);
  // A Text of 512 MiB: Cap'n Proto refuses it before allocating anything.
  auto result = pool.callResult([](Blocker::Client c) {
                      auto q = c.holdRequest();
                      q.initTag(uint32_t{512} << 20);
                      return q.send();
                    })
                    .wait(ws());
  auto& e = KJ_ASSERT_NONNULL(result.error);
  std::string description = e.getDescription().cStr();
  EXPECT_EQ(errorCode(e), ErrorCode::MESSAGE_TOO_LARGE) << description;
  EXPECT_TRUE(callNeverRan(errorCode(e)));
  EXPECT_NE(description.find("at most 512 MiB"), std::string::npos) << description;
  EXPECT_NE(description.find("blobs"), std::string::npos) << description;
  EXPECT_EQ(result.endpoint.name, "job-1/blocker-0");
  // Tried once, never counted against the member, which takes the next call.
  auto m = pool.metrics();
  EXPECT_EQ(m.sum("troupe_client_attempts_total"), 1);
  EXPECT_EQ(m.sum("troupe_client_calls_total", {{"code", "message_too_large"}}), 1);
  EXPECT_FALSE(pool.ejected("job-1/blocker-0"));
  auto released = pool.call([](Blocker::Client c) {
                        auto q = c.releaseRequest();
                        q.setTag("none");
                        return q.send();
                      })
                      .wait(ws());
  EXPECT_FALSE(released.getReleased());
}

TEST_F(ActorPoolTest, CallResultNamesTheMemberOfTheLastAttempt) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto raise = [](Member::Client c) {
    auto q = c.raiseRequest();
    q.setMessage("bad batch");
    return q.send();
  };
  for (auto expected : {"job-1/member-0", "job-1/member-1"}) {
    auto result = pool.callResult(raise).wait(ws());
    EXPECT_FALSE(result.ok());
    EXPECT_EQ(result.endpoint.name, expected);
    auto& e = KJ_ASSERT_NONNULL(result.error);
    EXPECT_TRUE(raisedByActor(e));
    EXPECT_NE(strstr(e.getDescription().cStr(), "bad batch"), nullptr);
  }
  auto answered =
      pool.callResult([](Member::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  ASSERT_TRUE(answered.ok());
  EXPECT_EQ(answered.endpoint.name, "job-1/member-0");
  EXPECT_EQ(answered.endpoint.address, group.readyMembers()[0]->endpoint.address);
  EXPECT_EQ(kj::StringPtr(answered.take().getName()), "job-1/member-0");
}

TEST_F(ActorPoolClockTest, CallResultNamesNoMemberWhenNoneWasTried) {
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  ActorPool<Member> pool(group);
  auto result = pool.callResult([](Member::Client c) { return c.whoamiRequest().send(); },
                                {.deadline = 50 * kj::MILLISECONDS});
  ASSERT_NO_FATAL_FAILURE(expireAt(50 * kj::MILLISECONDS, result));
  auto r = result.wait(ws());
  EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(r.error)), ErrorCode::NO_ENDPOINTS);
  EXPECT_EQ(r.endpoint.name, "");
  EXPECT_EQ(r.latency, 50 * kj::MILLISECONDS);
}

// A broadcast's results are taken once: a wait on a future already consumed says so.
TEST_F(ActorPoolTest, ABroadcastIsConsumedByItsWait) {
  startReplicas(1);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(1, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto future = pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); });
  EXPECT_EQ(future.size(), 1u);
  auto all = kj::mv(future).waitAll(5 * kj::SECONDS).wait(ws());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(all[0].ok());
  try {
    kj::mv(future).waitAny().wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT);
    EXPECT_NE(strstr(e.getDescription().cStr(), "taken already"), nullptr);
  }
}

TEST_F(ActorPoolTest, ADrainingMemberIsSkippedEvenForNonIdempotentCalls) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  // Member 0 holds a call so its drain lasts; it leaves the rotation.
  ActorGroup<Blocker> blockers(loop, resolver, "job-1", "blocker");
  blockers.waitReady(2, 10 * kj::SECONDS).wait(ws());
  auto held = ActorRef<Blocker>(blockers.readyMembers()[0]->ref);
  auto hold = test::holdStarted(held, "keep", 1, ws());
  auto drained = replicas[0]->server->drain();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(whoami(pool).wait(ws()), "job-1/member-1");
  replicas[0]->blocker.release("keep");
  hold.wait(ws());
  drained.wait(ws());
}

TEST_F(ActorPoolTest, ACallRefusedByAFullQueueRunsOnAnotherMemberEvenIfNotIdempotent) {
  startReplicas(2);
  BlockerState states[2];
  for (int i = 0; i < 2; ++i) {
    replicas[i]->server->host<Blocker>("bounded", kj::heap<test::BlockerImpl>(states[i]),
                                       {.maxQueued = 0});
  }
  ActorGroup<Blocker> group(loop, resolver, "job-1", "bounded");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  // Member 0 is busy with a call from elsewhere, and takes no call in waiting.
  ActorRef<Blocker> first(group.readyMembers()[0]->ref);
  auto busy = first.call([](Blocker::Client c) {
    auto q = c.holdRequest();
    q.setTag("busy");
    return q.send();
  });
  states[0].whenStarted(1).wait(ws());

  ActorPool<Blocker> pool(group);  // round robin starts with member 0
  auto stats = pool.call([](Blocker::Client c) { return c.statsRequest().send(); }).wait(ws());
  EXPECT_EQ(stats.getStarted(), 0u);  // member 1's: member 0 has started one call
  EXPECT_EQ(states[0].started, 1u);
  ASSERT_TRUE(states[0].release("busy"));
  busy.wait(ws());
}

TEST_F(ActorPoolTest, LeastOutstandingSpreadsHeldCalls) {
  startReplicas(2);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Blocker> pool(group, {.balancing = Balancing::LEAST_OUTSTANDING});
  auto hold = [&](kj::StringPtr tag) {
    return pool.call([tag](Blocker::Client c) {
      auto q = c.holdRequest();
      q.setTag(tag);
      return q.send();
    });
  };
  auto a = hold("a");
  auto b = hold("b");
  auto c = hold("c");
  auto d = hold("d");
  replicas[0]->blocker.whenStarted(2).wait(ws());
  replicas[1]->blocker.whenStarted(2).wait(ws());
  EXPECT_EQ(pool.outstanding("job-1/blocker-0"), 2u);
  EXPECT_EQ(pool.outstanding("job-1/blocker-1"), 2u);
  for (auto& r : replicas) {
    for (auto tag : {"a", "b", "c", "d"}) r->blocker.release(tag);
  }
  a.wait(ws());
  b.wait(ws());
  c.wait(ws());
  d.wait(ws());
  EXPECT_EQ(pool.outstanding("job-1/blocker-0"), 0u);
  // A call cancelled by its caller stops counting too.
  {
    auto dropped = hold("e");
    EXPECT_EQ(pool.outstanding("job-1/blocker-0") + pool.outstanding("job-1/blocker-1"), 1u);
  }
  EXPECT_EQ(pool.outstanding("job-1/blocker-0") + pool.outstanding("job-1/blocker-1"), 0u);
}

// Members and the group share the loop's credentials, job credential included.
class ActorPoolDrainTest : public ActorPoolTest {
protected:
  ActorPoolDrainTest()
      : ActorPoolTest({}, std::make_shared<Credentials>(CredentialsOptions{
                              .jobId = "job-1", .jobToken = "job-1's credential"})) {}
};

TEST_F(ActorPoolDrainTest, DrainMembersDrainsEveryMemberAndTheyLeave) {
  startReplicas(3);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  group.drainMembers(1 * kj::SECONDS).wait(ws());
  // Each server got the request and drains (nothing is in flight, so it stops at once); the
  // group sees the members go.
  for (auto& r : replicas) {
    EXPECT_NE(r->server->state(), ServerState::SERVING);
    r->server->drain().wait(ws());  // joins the drain the group asked for
    EXPECT_EQ(r->server->state(), ServerState::STOPPED);
  }
  while (group.members().size() > 0) group.whenChanged().wait(ws());
  EXPECT_EQ(group.readyCount(), 0u);
}

TEST_F(ActorPoolTest, ACallWaitsForAMemberToAppear) {
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  ActorPool<Member> pool(group);
  auto pending = whoami(pool, {.deadline = 10 * kj::SECONDS});
  EXPECT_FALSE(pending.poll(ws()));
  startReplicas(1);
  EXPECT_EQ(pending.wait(ws()), "job-1/member-0");
}

TEST_F(ActorPoolClockTest, NoMemberUntilTheDeadlineIsNoEndpoints) {
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  ActorPool<Member> pool(group, {.maxAttempts = 2});
  // Unrelated activity in the group does not use up the call's attempts: it waits for a READY
  // member until its deadline.
  Endpoint starting;
  starting.name = "job-1/member-9";
  starting.address = "tcp://127.0.0.1:1";
  starting.state = EndpointState::STARTING;
  auto pending = whoami(pool, {.deadline = 50 * kj::MILLISECONDS});
  for (int i = 0; i < 5; ++i) {
    resolver.add(starting);
    resolver.remove(starting.name);
  }
  ASSERT_NO_FATAL_FAILURE(expireAt(50 * kj::MILLISECONDS, pending));
  try {
    pending.wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::NO_ENDPOINTS) << e.getDescription().cStr();
    EXPECT_TRUE(callNeverRan(errorCode(e)));
  }
}

TEST_F(ActorPoolTest, AnActorPassingOnATroupeErrorIsNotRetried) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  // An actor that failed with what looks like troupe's "never ran" codes: it did run.
  auto throwing = [&](kj::StringPtr description, kj::Exception::Type type, bool idempotent) {
    return pool.call(
        [description, type](Member::Client c) {
          auto q = c.throwRequest();
          q.setDescription(description);
          q.setType(static_cast<uint8_t>(type));
          return q.send();
        },
        {.idempotent = idempotent});
  };
  struct Case {
    kj::StringPtr description;
    kj::Exception::Type type;
  };
  for (auto c : {Case{"troupe.unreachable: downstream gone", kj::Exception::Type::DISCONNECTED},
                 Case{"troupe.draining: downstream drains", kj::Exception::Type::OVERLOADED},
                 Case{"queue full", kj::Exception::Type::OVERLOADED}}) {
    for (bool idempotent : {false, true}) {
      uint64_t before = replicas[0]->member->count + replicas[1]->member->count;
      try {
        throwing(c.description, c.type, idempotent).wait(ws());
        ADD_FAILURE() << "the actor's exception must come back";
      } catch (const kj::Exception& e) {
        EXPECT_TRUE(raisedByActor(e)) << e.getDescription().cStr();
        EXPECT_EQ(e.getType(), c.type);
        EXPECT_FALSE(callNeverRan(errorCode(e))) << e.getDescription().cStr();
        EXPECT_NE(strstr(e.getDescription().cStr(), c.description.cStr()), nullptr);
      }
      EXPECT_EQ(replicas[0]->member->count + replicas[1]->member->count, before + 1)
          << c.description.cStr() << (idempotent ? " (idempotent)" : "");
    }
  }
}

TEST_F(ActorPoolClockTest, ThePoolsDeadlineBoundsTheCall) {
  startReplicas(1);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(1, 10 * kj::SECONDS).wait(ws());
  ActorPool<Blocker> pool(group);
  auto call = pool.call(
      [](Blocker::Client c) {
        auto q = c.holdRequest();
        q.setTag("slow");
        return q.send();
      },
      {.deadline = 30 * kj::MILLISECONDS});
  replicas[0]->blocker.whenStarted(1).wait(ws());
  ASSERT_NO_FATAL_FAILURE(expireAt(30 * kj::MILLISECONDS, call));
  try {
    call.wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED) << e.getDescription().cStr();
  }
  replicas[0]->blocker.whenCancelled(1).wait(ws());
  EXPECT_EQ(pool.outstanding("job-1/blocker-0"), 0u);
}

}  // namespace
}  // namespace troupe
