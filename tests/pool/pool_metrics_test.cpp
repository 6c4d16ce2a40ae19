// What an ActorPool's metrics say after known traffic.

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

class PoolMetricsTest : public ::testing::Test {
protected:
  ~PoolMetricsTest() noexcept override {}

  void startReplicas(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) replicas.add(kj::heap<test::PoolReplica>(loop, resolver, i));
  }

  kj::WaitScope& ws() { return loop.waitScope(); }

  static kj::Promise<void> whoami(ActorPool<Member>& pool, CallOptions options = {}) {
    return pool.call([](Member::Client c) { return c.whoamiRequest().send(); }, options)
        .ignoreResult();
  }

  static MetricLabels labels(std::initializer_list<std::pair<const char*, const char*>> more = {}) {
    MetricLabels l = {{"job", "job-1"}, {"actor", "member"}};
    for (auto& [k, v] : more) l.emplace_back(k, v);
    return l;
  }

  EventLoop loop;
  FixedResolver resolver;
  kj::Vector<kj::Own<test::PoolReplica>> replicas;
};

TEST_F(PoolMetricsTest, CallsErrorsAndEachMembersAttemptsAreCountedExactly) {
  startReplicas(3);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  for (int i = 0; i < 3; ++i) whoami(pool).wait(ws());
  auto raised = pool.call([](Member::Client c) {
    auto r = c.raiseRequest();
    r.setMessage("no");
    return r.send();
  });
  EXPECT_ANY_THROW(raised.wait(ws()));

  auto m = pool.metrics();
  EXPECT_EQ(m.value("troupe_client_calls_total", labels({{"code", "ok"}})), 3);
  EXPECT_EQ(m.value("troupe_client_calls_total", labels({{"code", "failed"}})), 1);
  EXPECT_EQ(m.histogram("troupe_client_call_duration_seconds", labels()).count, 4u);
  // Round robin: members 0, 1, 2, then 0 again for the call that failed.
  EXPECT_EQ(m.value("troupe_client_attempts_total", labels({{"member", "job-1/member-0"}})), 2);
  EXPECT_EQ(m.value("troupe_client_attempts_total", labels({{"member", "job-1/member-1"}})), 1);
  EXPECT_EQ(m.value("troupe_client_attempts_total", labels({{"member", "job-1/member-2"}})), 1);
  EXPECT_EQ(m.value("troupe_client_attempt_failures_total", labels({{"member", "job-1/member-0"}})),
            1);
  EXPECT_EQ(m.histogram("troupe_client_attempt_duration_seconds",
                        labels({{"member", "job-1/member-0"}}))
                .count,
            2u);
  EXPECT_EQ(m.value("troupe_client_retries_total", labels()), 0);
  EXPECT_EQ(m.value("troupe_client_calls_in_flight", labels()), 0);
  // The same series are in the loop's metrics, beside the servers'.
  auto all = loop.metrics().collect();
  EXPECT_EQ(all.value("troupe_client_calls_total", labels({{"code", "ok"}})), 3);
  EXPECT_EQ(all.sum("troupe_calls_total", {{"actor", "member"}, {"code", "ok"}}), 3);
  // The members' own handles count nothing: the pool counted each attempt above.
  EXPECT_EQ(all.family("troupe_ref_calls_total"), nullptr);
}

TEST_F(PoolMetricsTest, AFailoverIsCountedAsARetryOnAnotherMember) {
  startReplicas(2);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(2, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  // A call held on member 0 keeps its drain from finishing.
  auto blocker = ActorRef<Blocker>::connect(loop, replicas[0]->server->listenAddresses()[0].c_str(),
                                            "blocker");
  auto held = blocker.call([](Blocker::Client c) {
    auto r = c.holdRequest();
    r.setTag("keep");
    return r.send();
  });
  for (int i = 0; i < 1000 && replicas[0]->blocker.started == 0; ++i) ws().poll();
  ASSERT_EQ(replicas[0]->blocker.started, 1u);

  // Member 0 drains: the next call, sent to it, is refused before it ran and goes to member 1.
  auto drained = replicas[0]->server->drain();
  whoami(pool).wait(ws());
  auto m = pool.metrics();
  EXPECT_EQ(m.value("troupe_client_retries_total", labels()), 1);
  EXPECT_EQ(m.value("troupe_client_failovers_total", labels()), 1);
  EXPECT_EQ(m.value("troupe_client_attempt_failures_total", labels({{"member", "job-1/member-0"}})),
            1);
  EXPECT_EQ(m.value("troupe_client_calls_total", labels({{"code", "ok"}})), 1);

  replicas[0]->blocker.release("keep");
  held.wait(ws());
  drained.wait(ws());
}

TEST_F(PoolMetricsTest, BroadcastMembersAreCountedByOutcome) {
  startReplicas(3);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws());
  ActorPool<Member> pool(group);
  auto results = pool.broadcast([](Member::Client c) {
                       auto r = c.raiseRequest();
                       r.setMessage("all fail");
                       return r.send();
                     })
                     .waitAll(10 * kj::SECONDS)
                     .wait(ws());
  ASSERT_EQ(results.size(), 3u);
  pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); })
      .waitAll(10 * kj::SECONDS)
      .wait(ws());
  auto m = pool.metrics();
  EXPECT_EQ(m.value("troupe_client_broadcasts_total", labels()), 2);
  EXPECT_EQ(m.value("troupe_client_broadcast_members_total", labels({{"code", "failed"}})), 3);
  EXPECT_EQ(m.value("troupe_client_broadcast_members_total", labels({{"code", "ok"}})), 3);
  EXPECT_EQ(m.value("troupe_client_attempts_total", labels({{"member", "job-1/member-2"}})), 2);
  EXPECT_EQ(m.value("troupe_client_attempt_failures_total", labels({{"member", "job-1/member-2"}})),
            1);
}

}  // namespace
}  // namespace troupe
