// What a pool's and a group's lifetimes mean for the calls and members they hand out: a pool
// destroyed with calls in flight cancels them with a clear error, drain() lets them finish, and
// members handed out by a group are owned snapshots. Also how pool and broadcast errors name
// the member they concern, and what waitReady says when a job ends.

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "tests/support/pool_replica.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::Blocker;
using test::Member;

kj::Promise<capnp::Response<Blocker::HoldResults>> hold(Blocker::Client c, kj::StringPtr tag) {
  auto q = c.holdRequest();
  q.setTag(tag);
  return q.send();
}

class PoolLifetimeTest : public ::testing::Test {
protected:
  ~PoolLifetimeTest() noexcept override {}

  void startReplicas(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) replicas.add(kj::heap<test::PoolReplica>(loop, resolver, i));
  }

  kj::WaitScope& ws() { return loop.waitScope(); }

  // Waits until every replica's blocker has started a hold.
  void awaitEachStarted() {
    for (auto& r : replicas) r->blocker.whenStarted(1).wait(ws());
  }

  template <typename T>
  kj::Exception failureOf(kj::Promise<T>&& promise) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { promise.wait(ws()); })) {
      return kj::mv(*e);
    }
    ADD_FAILURE() << "the promise did not fail";
    return KJ_EXCEPTION(FAILED, "no failure");
  }

  EventLoop loop;
  FixedResolver resolver;
  kj::Vector<kj::Own<test::PoolReplica>> replicas;
};

TEST_F(PoolLifetimeTest, DestroyingThePoolRejectsItsCallsAndCancelsThemOnTheServer) {
  startReplicas(1);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(1, 10 * kj::SECONDS).wait(ws());
  auto pool = kj::heap<ActorPool<Blocker>>(group);
  auto held = pool->call([](Blocker::Client c) { return hold(c, "a"); });
  replicas[0]->blocker.whenStarted(1).wait(ws());
  EXPECT_EQ(pool->callsInFlight(), 1u);

  pool = nullptr;
  auto e = failureOf(kj::mv(held));
  EXPECT_EQ(errorCode(e), ErrorCode::FAILED) << e.getDescription().cStr();
  EXPECT_NE(strstr(e.getDescription().cStr(), "pool over job-1/blocker- was destroyed"), nullptr)
      << e.getDescription().cStr();
  // The call itself was cancelled: the server saw it go.
  replicas[0]->blocker.whenCancelled(1).wait(ws());
  EXPECT_EQ(replicas[0]->blocker.finished, 0u);
}

TEST_F(PoolLifetimeTest, DestroyingThePoolFailsTheBroadcastMembersStillRunning) {
  startReplicas(2);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  auto pool = kj::heap<ActorPool<Blocker>>(group);
  auto future = pool->broadcast([](Blocker::Client c) { return hold(c, "b"); });
  awaitEachStarted();
  pool = nullptr;
  auto results = kj::mv(future).waitAll(10 * kj::SECONDS).wait(ws());
  ASSERT_EQ(results.size(), 2u);
  for (auto& r : results) {
    auto& e = KJ_ASSERT_NONNULL(r.error);
    EXPECT_EQ(errorCode(e), ErrorCode::FAILED);
    EXPECT_NE(strstr(e.getDescription().cStr(), r.endpoint.name.c_str()), nullptr)
        << e.getDescription().cStr();
    EXPECT_NE(strstr(e.getDescription().cStr(), "was destroyed"), nullptr);
  }
}

TEST_F(PoolLifetimeTest, DrainWaitsForCallsInFlightAndRefusesNewOnes) {
  startReplicas(1);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(1, 10 * kj::SECONDS).wait(ws());
  ActorPool<Blocker> pool(group);
  auto held = pool.call([](Blocker::Client c) { return hold(c, "c"); });
  replicas[0]->blocker.whenStarted(1).wait(ws());

  auto drained = pool.drain();
  EXPECT_FALSE(drained.poll(ws()));
  auto refused = failureOf(pool.call([](Blocker::Client c) { return hold(c, "d"); }));
  EXPECT_EQ(errorCode(refused), ErrorCode::DRAINING) << refused.getDescription().cStr();
  auto broadcast = pool.broadcast([](Blocker::Client c) { return hold(c, "e"); })
                       .waitAll(10 * kj::SECONDS)
                       .wait(ws());
  ASSERT_EQ(broadcast.size(), 1u);
  EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(broadcast[0].error)), ErrorCode::DRAINING);
  EXPECT_EQ(replicas[0]->blocker.started, 1u);  // neither reached the server

  EXPECT_TRUE(replicas[0]->blocker.release("c"));
  EXPECT_EQ(held.wait(ws()).getTag(), "c");
  drained.wait(ws());
  EXPECT_EQ(pool.callsInFlight(), 0u);
  pool.drain().wait(ws());  // joins the finished drain
}

TEST_F(PoolLifetimeTest, DestroyingThePoolDuringADrainRejectsTheDrain) {
  startReplicas(1);
  ActorGroup<Blocker> group(loop, resolver, "job-1", "blocker");
  group.waitReady(1, 10 * kj::SECONDS).wait(ws());
  auto pool = kj::heap<ActorPool<Blocker>>(group);
  auto held = pool->call([](Blocker::Client c) { return hold(c, "g"); });
  replicas[0]->blocker.whenStarted(1).wait(ws());
  auto drained = pool->drain();
  pool = nullptr;
  auto e = failureOf(kj::mv(drained));
  EXPECT_EQ(errorCode(e), ErrorCode::FAILED) << e.getDescription().cStr();
  EXPECT_NE(strstr(e.getDescription().cStr(), "was destroyed"), nullptr);
  EXPECT_EQ(errorCode(failureOf(kj::mv(held))), ErrorCode::FAILED);
}

TEST_F(PoolLifetimeTest, DestroyingTheGroupRejectsAWaitReadyInFlight) {
  startReplicas(1);
  auto group = kj::heap<ActorGroup<Member>>(loop, resolver, "job-1", "member");
  auto waiting = group->waitReady(2, 10 * kj::SECONDS);
  group->waitReady(1, 10 * kj::SECONDS).wait(ws());  // its change has been seen
  group = nullptr;
  auto e = failureOf(kj::mv(waiting));
  EXPECT_EQ(errorCode(e), ErrorCode::FAILED) << e.getDescription().cStr();
  EXPECT_NE(strstr(e.getDescription().cStr(), "group job-1/member-* was destroyed while a wait"),
            nullptr)
      << e.getDescription().cStr();
}

TEST_F(PoolLifetimeTest, MembersHandedOutAreSnapshotsThatOutliveTheGroup) {
  startReplicas(2);
  auto group = kj::heap<ActorGroup<Member>>(loop, resolver, "job-1", "member");
  group->waitReady(2, 10 * kj::SECONDS).wait(ws());
  auto members = group->readyMembers();
  ASSERT_EQ(members.size(), 2u);
  auto first = group->readyMember(0);
  EXPECT_EQ(first->endpoint.name, "job-1/member-0");
  EXPECT_EQ(first.get(), members[0].get());

  // Member 1 drains: the group reports it anew, the snapshot handed out stays as it was.
  auto drained = replicas[1]->server->drain();
  while (group->readyCount() > 1) group->whenChanged().wait(ws());
  EXPECT_EQ(members[1]->endpoint.state, EndpointState::READY);
  drained.wait(ws());

  // Without the group, a member handed out still calls its actor.
  group = nullptr;
  auto name = ActorRef<Member>(members[0]->ref)
                  .call([](Member::Client c) { return c.whoamiRequest().send(); })
                  .wait(ws());
  EXPECT_EQ(name.getName(), "job-1/member-0");
}

TEST_F(PoolLifetimeTest, BroadcastErrorsOfTheActorNameTheMemberAndKeepTheirCode) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto raised = pool.broadcast([](Member::Client c) {
                      auto q = c.raiseRequest();
                      q.setMessage("no weights yet");
                      return q.send();
                    })
                    .waitAll(10 * kj::SECONDS)
                    .wait(ws());
  ASSERT_EQ(raised.size(), 2u);
  for (auto& r : raised) {
    auto& e = KJ_ASSERT_NONNULL(r.error);
    kj::StringPtr text = e.getDescription();
    EXPECT_TRUE(raisedByActor(e)) << text.cStr();
    EXPECT_EQ(errorCode(e), ErrorCode::FAILED);
    EXPECT_NE(strstr(text.cStr(), r.endpoint.name.c_str()), nullptr) << text.cStr();
    EXPECT_NE(strstr(text.cStr(), r.endpoint.address.c_str()), nullptr) << text.cStr();
    EXPECT_NE(strstr(text.cStr(), "no weights yet"), nullptr) << text.cStr();
  }
}

TEST_F(PoolLifetimeTest, WaitReadySaysWhoWasReadyWhenTheJobEnds) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  auto waiting = group.waitReady(5, 60 * kj::SECONDS);
  // Ending the job removes its endpoints first, then says it ended.
  resolver.setJobStatus({"job-1", JobState::ENDED, "stopped: terminated"}).wait(ws());
  auto e = failureOf(kj::mv(waiting));
  EXPECT_EQ(errorCode(e), ErrorCode::JOB_ENDED);
  kj::StringPtr text = e.getDescription();
  EXPECT_NE(strstr(text.cStr(), "2 of the 5 wanted members were ready before it ended"), nullptr)
      << text.cStr();
  EXPECT_NE(strstr(text.cStr(), "job-1/member-0 ready, job-1/member-1 ready"), nullptr)
      << text.cStr();
  EXPECT_NE(strstr(text.cStr(), "stopped: terminated"), nullptr) << text.cStr();
}

}  // namespace
}  // namespace troupe
