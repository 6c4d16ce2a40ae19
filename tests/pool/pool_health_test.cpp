// A pool's view of its members' health: attempts given up past their timeout, members that do
// not answer a ping ejected, failures in a row ejecting a member, and (in child processes) a
// frozen member among three costing no idempotent call.
//
// In process, the member that never answers is a listening socket nobody accepts on: the kernel
// completes the connection and takes what is sent, and no answer ever comes, as with a frozen
// process. Those tests run on a manual clock, so every timeout ends when the test moves time.

#include <signal.h>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "tests/support/pool_replica.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_server.h"

namespace troupe {
namespace {

using test::Member;

kj::Promise<std::string> whoami(ActorPool<Member>& pool, CallOptions options = {}) {
  return pool.call([](Member::Client c) { return c.whoamiRequest().send(); }, options)
      .then([](auto r) { return std::string(r.getName().cStr()); });
}

// job-1/member-0 never answers (see above); job-1/member-1 is a real replica in this process.
class PoolHealthTest : public ::testing::Test {
protected:
  explicit PoolHealthTest(EventLoopOptions loopOptions = {.manualClock = true})
      : loop(kj::mv(loopOptions)) {
    silent = loop.network().parseAddress("127.0.0.1", 0).wait(ws())->listen();
    Endpoint e;
    e.name = "job-1/member-0";
    e.address = kj::str("tcp://127.0.0.1:", silent->getPort()).cStr();
    e.state = EndpointState::READY;
    resolver.add(e);
    replica = kj::heap<test::PoolReplica>(loop, resolver, 1);
    group = kj::heap<ActorGroup<Member>>(loop, resolver, "job-1", "member");
    group->waitReady(2, 10 * kj::SECONDS).wait(ws());
  }
  ~PoolHealthTest() noexcept override {}

  kj::WaitScope& ws() { return loop.waitScope(); }

  // Moves the clock to a nanosecond short of `duration`, checks that `promise` is pending, then
  // to `duration` and checks that it has settled.
  template <typename T>
  void settlesAt(kj::Duration duration, kj::Promise<T>& promise) {
    loop.advanceTime(duration - 1 * kj::NANOSECONDS);
    EXPECT_FALSE(promise.poll(ws())) << "settled before its time";
    loop.advanceTime(1 * kj::NANOSECONDS);
    ASSERT_TRUE(promise.poll(ws())) << "still pending at its time";
  }

  EventLoop loop;
  FixedResolver resolver;
  kj::Own<kj::ConnectionReceiver> silent;
  kj::Own<test::PoolReplica> replica;
  kj::Own<ActorGroup<Member>> group;
};

TEST_F(PoolHealthTest, AnIdempotentAttemptPastTheAttemptTimeoutGoesToAnotherMember) {
  ActorPool<Member> pool(*group,
                         {.attemptTimeout = 100 * kj::MILLISECONDS, .probeAfter = 0 * kj::SECONDS});
  // Round robin starts with member 0.
  auto moved = whoami(pool, {.idempotent = true});
  ws().poll();
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 1u);
  ASSERT_NO_FATAL_FAILURE(settlesAt(100 * kj::MILLISECONDS, moved));
  EXPECT_EQ(moved.wait(ws()), "job-1/member-1");
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 0u);  // cancelled there

  // A call that is not idempotent is never given up on: only its deadline ends it. (The
  // retry above went to member 1, so this one starts at member 0.)
  auto waiting = whoami(pool, {.deadline = 2 * kj::SECONDS});
  ws().poll();
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 1u);
  ASSERT_NO_FATAL_FAILURE(settlesAt(2 * kj::SECONDS, waiting));
  try {
    waiting.wait(ws());
    FAIL() << "a call to a member that never answers succeeded";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED) << e.getDescription().cStr();
  }
}

TEST_F(PoolHealthTest, AMemberThatDoesNotAnswerAPingIsEjectedAndItsIdempotentCallsMove) {
  ActorPool<Member> pool(*group);  // probes after 1 s, for 1 s; ejects for 1 s, then 2 s
  auto moved = whoami(pool, {.idempotent = true});            // member 0
  EXPECT_EQ(whoami(pool).wait(ws()), "job-1/member-1");       // member 1
  auto stuck = whoami(pool, {.deadline = 10 * kj::SECONDS});  // member 0, not idempotent
  ws().poll();
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 2u);

  // The ping goes out 1 s after the first call; 1 s later it has no answer.
  loop.advanceTime(1 * kj::SECONDS);
  ws().poll();
  EXPECT_FALSE(pool.ejected("job-1/member-0"));
  ASSERT_NO_FATAL_FAILURE(settlesAt(1 * kj::SECONDS, moved));
  EXPECT_EQ(moved.wait(ws()), "job-1/member-1");
  EXPECT_TRUE(pool.ejected("job-1/member-0"));
  EXPECT_FALSE(stuck.poll(ws())) << "a call that is not idempotent was given up on";

  // New calls, of either kind, avoid it.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(whoami(pool, {.idempotent = i % 2 == 0}).wait(ws()), "job-1/member-1");
  }
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 1u);

  // After its ejection (1 s) it is pinged before it gets a call; unanswered, it stays out.
  loop.advanceTime(1 * kj::SECONDS);
  EXPECT_EQ(whoami(pool).wait(ws()), "job-1/member-1");
  EXPECT_TRUE(pool.ejected("job-1/member-0"));
  loop.advanceTime(1 * kj::SECONDS);  // the readmission ping's timeout
  ws().poll();
  loop.advanceTime(1 * kj::SECONDS);  // half of the second ejection (2 s)
  EXPECT_TRUE(pool.ejected("job-1/member-0"));
  EXPECT_EQ(whoami(pool).wait(ws()), "job-1/member-1");

  EXPECT_FALSE(stuck.poll(ws()));
  loop.advanceTime(6 * kj::SECONDS);  // 10 s after it started
  try {
    stuck.wait(ws());
    FAIL() << "a call to a member that never answers succeeded";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED) << e.getDescription().cStr();
  }
}

TEST_F(PoolHealthTest, WhenEveryMemberIsEjectedThePoolStillSendsToThem) {
  replica = nullptr;  // member 1 goes; member 0 alone never answers
  while (group->readyCount() != 1) group->whenChanged().wait(ws());
  ActorPool<Member> pool(*group);
  auto first = whoami(pool, {.deadline = 10 * kj::SECONDS, .idempotent = true});
  loop.advanceTime(1 * kj::SECONDS);  // the probe
  ws().poll();
  loop.advanceTime(1 * kj::SECONDS);  // and no answer
  ws().poll();
  EXPECT_TRUE(pool.ejected("job-1/member-0"));
  // Given up there, with no other member the call tries it again after its backoff (at most
  // 10 ms) rather than wait for none.
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 0u);
  loop.advanceTime(10 * kj::MILLISECONDS);
  ws().poll();
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 1u);
  auto second = whoami(pool, {.deadline = 10 * kj::SECONDS});
  ws().poll();
  EXPECT_EQ(pool.outstanding("job-1/member-0"), 2u);
}

class PoolFailureTest : public PoolHealthTest {
protected:
  PoolFailureTest() : PoolHealthTest(EventLoopOptions{}) {}
};

TEST_F(PoolFailureTest, FailuresInARowEjectAMember) {
  // Nothing listens where member 2 is: each attempt there fails at once, never having run, and
  // the call goes on to member 1.
  uint16_t closed;
  {
    auto l = loop.network().parseAddress("127.0.0.1", 0).wait(ws())->listen();
    closed = l->getPort();
  }
  Endpoint gone;
  gone.name = "job-1/member-2";
  gone.address = kj::str("tcp://127.0.0.1:", closed).cStr();
  gone.state = EndpointState::READY;
  resolver.remove("job-1/member-0");
  while (group->readyCount() != 1) group->whenChanged().wait(ws());
  resolver.add(gone);
  while (group->readyCount() != 2) group->whenChanged().wait(ws());

  ActorPool<Member> pool(*group, {.ejectAfterFailures = 2});
  size_t sent = 0;
  while (!pool.ejected("job-1/member-2")) {
    ASSERT_LT(sent, 6u) << "two failures in a row did not eject the member";
    EXPECT_EQ(whoami(pool).wait(ws()), "job-1/member-1");
    ++sent;
  }
  EXPECT_LE(sent, 4u);  // every other call starts at member 2
  auto before = replica->member->count;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(whoami(pool).wait(ws()), "job-1/member-1");
  EXPECT_EQ(replica->member->count, before + 4);
}

// The target users care about: three replicas in child processes, one SIGSTOPped under steady
// load. Every idempotent call succeeds, and throughput stays above half of what it was. Real
// time, since throughput is the subject. The probe runs after 100 ms for 100 ms, so that the
// member is out within a small part of a 2 s window.
TEST(PoolFrozenMemberTest, OneFrozenMemberOfThreeFailsNoIdempotentCallAndKeepsHalfThroughput) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  kj::Vector<kj::Own<test::TestServer>> servers;
  for (uint32_t i = 0; i < 3; ++i) {
    servers.add(kj::heap<test::TestServer>(
        std::vector<std::string>{},
        std::vector<std::string>{"TROUPE_TASK_INDEX=" + std::to_string(i), "TROUPE_NUM_TASKS=3"}));
    Endpoint e;
    e.name = "test/member-" + std::to_string(i);
    e.address = servers.back()->address;
    e.incarnation = servers.back()->incarnation;
    e.state = EndpointState::READY;
    resolver.add(e);
  }
  ActorGroup<Member> group(loop, resolver, "test", "member");
  group.waitReady(3, 10 * kj::SECONDS).wait(ws);
  ActorPool<Member> pool(group, {.probeAfter = 100 * kj::MILLISECONDS,
                                 .probeTimeout = 100 * kj::MILLISECONDS});

  // Eight callers, each making one idempotent call after another until told to stop.
  struct Load {
    uint64_t done = 0;
    uint64_t failed = 0;
    kj::Vector<kj::String> errors;
    bool stop = false;
  } load;
  kj::Function<kj::Promise<void>()> caller = [&]() -> kj::Promise<void> {
    if (load.stop) return kj::READY_NOW;
    return whoami(pool, {.deadline = 5 * kj::SECONDS, .idempotent = true})
        .then([&](std::string) { ++load.done; },
              [&](kj::Exception&& e) {
                ++load.failed;
                if (load.errors.size() < 5) load.errors.add(kj::str(e.getDescription()));
              })
        .then([&]() { return caller(); });
  };
  kj::Vector<kj::Promise<void>> callers;
  for (int i = 0; i < 8; ++i) callers.add(caller());

  // Calls completed over `window` of real time.
  auto countOver = [&](kj::Duration window) {
    uint64_t before = load.done;
    loop.timer().afterDelay(window).wait(ws);
    return load.done - before;
  };
  countOver(300 * kj::MILLISECONDS);  // connections made, warm
  auto normal = countOver(2 * kj::SECONDS);
  ASSERT_TRUE(servers[1]->process.freeze());
  auto frozen = countOver(2 * kj::SECONDS);
  EXPECT_TRUE(pool.ejected("test/member-1"));
  servers[1]->process.thaw();
  load.stop = true;
  kj::joinPromises(callers.releaseAsArray()).wait(ws);

  std::printf("frozen member: %llu calls in 2 s before, %llu in 2 s with one of 3 frozen\n",
              static_cast<unsigned long long>(normal), static_cast<unsigned long long>(frozen));
  EXPECT_EQ(load.failed, 0u) << kj::strArray(load.errors, "\n").cStr();
  EXPECT_GE(frozen * 2, normal);
}

}  // namespace
}  // namespace troupe
