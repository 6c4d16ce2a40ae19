// Pools over replicas in child processes (tests/support/test_server_main.cpp), listed in a
// FixedResolver, with members killed mid-run.

#include <signal.h>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_server.h"

namespace troupe {
namespace {

using test::Blocker;
using test::Member;

// `n` test servers of job "test" with task indexes 0..n-1, listed in `resolver` for the
// actors "member" and "blocker".
kj::Vector<kj::Own<test::TestServer>> startReplicas(FixedResolver& resolver, uint32_t n) {
  kj::Vector<kj::Own<test::TestServer>> servers;
  for (uint32_t i = 0; i < n; ++i) {
    servers.add(kj::heap<test::TestServer>(
        std::vector<std::string>{},
        std::vector<std::string>{"TROUPE_TASK_INDEX=" + std::to_string(i),
                                 "TROUPE_NUM_TASKS=" + std::to_string(n)}));
    for (auto actor : {"member", "blocker"}) {
      Endpoint e;
      e.name = "test/" + std::string(actor) + "-" + std::to_string(i);
      e.address = servers.back()->address;
      e.incarnation = servers.back()->incarnation;
      e.state = EndpointState::READY;
      resolver.add(e);
    }
  }
  return servers;
}

kj::Promise<std::string> whoami(ActorPool<Member>& pool, bool idempotent) {
  return pool
      .call([](Member::Client c) { return c.whoamiRequest().send(); }, {.idempotent = idempotent})
      .then([](auto r) { return std::string(r.getName().cStr()); });
}

TEST(PoolFailover, AMemberKilledMidCallFailsThatCallAsMayHaveRunAndThePoolKeepsServing) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  auto servers = startReplicas(resolver, 2);

  ActorGroup<Blocker> blockers(loop, resolver, "test", "blocker");
  blockers.waitReady(2, 10 * kj::SECONDS).wait(ws);
  ActorPool<Blocker> pool(blockers);
  // Round robin starts with member 0: a call that is not idempotent lands there and hangs.
  auto held = pool.call([](Blocker::Client c) {
    auto q = c.holdRequest();
    q.setTag("lost");
    return q.send();
  });
  auto direct = ActorRef<Blocker>::connect(loop, servers[0]->address.c_str(), "blocker");
  direct
      .call([](Blocker::Client c) {
        auto q = c.waitStartedRequest();
        q.setCount(1);
        return q.send();
      })
      .wait(ws);
  servers[0]->process.kill(SIGKILL);
  servers[0]->process.wait();
  try {
    held.wait(ws);
    FAIL() << "the call in flight on the killed member must fail";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::MAY_HAVE_RUN) << e.getDescription().cStr();
    EXPECT_NE(strstr(e.getDescription().cStr(), "test/blocker-0"), nullptr)
        << e.getDescription().cStr();
    EXPECT_FALSE(callNeverRan(errorCode(e)));
  }
  // The pool's metrics say so.
  MetricLabels labels = {{"job", "test"}, {"actor", "blocker"}};
  auto counted = pool.metrics();
  EXPECT_EQ(counted.value("troupe_client_may_have_run_total", labels), 1);
  labels.emplace_back("code", "may_have_run");
  EXPECT_EQ(counted.value("troupe_client_calls_total", labels), 1);

  // Member 0 is still listed (a fixed table), but calls fail over to member 1: idempotent
  // ones, and others too, because an unreachable member never saw them.
  ActorGroup<Member> members(loop, resolver, "test", "member");
  members.waitReady(2, 10 * kj::SECONDS).wait(ws);
  ActorPool<Member> memberPool(members);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(whoami(memberPool, true).wait(ws), "test/member-1");
    EXPECT_EQ(whoami(memberPool, false).wait(ws), "test/member-1");
  }
}

TEST(PoolFailover, BroadcastWithOneMemberKilledReturnsTheOthersAndOneDisconnected) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  auto servers = startReplicas(resolver, 3);
  ActorGroup<Member> group(loop, resolver, "test", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws);
  ActorPool<Member> pool(group);
  // Connect to everyone first, so the killed member's connection breaks under the pool.
  auto warm = pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); })
                  .waitAll(5 * kj::SECONDS)
                  .wait(ws);
  for (auto& r : warm) ASSERT_TRUE(r.ok());

  servers[1]->process.kill(SIGKILL);
  servers[1]->process.wait();
  auto results = pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); })
                     .waitAll(5 * kj::SECONDS)
                     .wait(ws);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_TRUE(results[2].ok());
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].endpoint.name, "test/member-1");
  auto& e = KJ_ASSERT_NONNULL(results[1].error);
  EXPECT_EQ(e.getType(), kj::Exception::Type::DISCONNECTED) << e.getDescription().cStr();
  // The call may have reached the member before it died: sent again to the same address, it
  // could not learn its fate. Named like the pool's own errors: the member and its address, not
  // a bare "Peer disconnected.".
  EXPECT_EQ(errorCode(e), ErrorCode::MAY_HAVE_RUN) << e.getDescription().cStr();
  EXPECT_FALSE(raisedByActor(e));
  EXPECT_TRUE(errorMessage(e).startsWith(kj::str("test/member-1 (", servers[1]->address, "): ")))
      << e.getDescription().cStr();
}

}  // namespace
}  // namespace troupe
