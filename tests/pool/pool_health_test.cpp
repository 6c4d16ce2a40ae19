// A pool's view of its members' health: attempts given up past their timeout, members that do
// not answer a ping ejected, failures in a row ejecting a member, a member busy moving a large
// message not ejected for the pings that wait behind it, and (in child processes) a frozen member
// among three costing no idempotent call.
//
// In process, the member that never answers is a listening socket nobody accepts on: the kernel
// completes the connection and takes what is sent, and no answer ever comes, as with a frozen
// process. Those tests run on a manual clock, so every timeout ends when the test moves time.

#include <signal.h>

#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "troupe/net/address.h"
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

// A TCP proxy in front of one server that moves bytes only as the test allows: the slow path a
// large message takes on a busy network, paced by the test rather than by a clock. Each
// direction moves what allow() let it, then reads nothing more (so TCP holds the sender back)
// until allowed again. Loop thread only.
class Valve {
public:
  Valve(EventLoop& loop, kj::StringPtr target) : loop(loop), target(Address::parse(target)) {
    listener = loop.network().parseAddress("127.0.0.1", 0).wait(loop.waitScope())->listen();
    accepting = accept().eagerlyEvaluate([](kj::Exception&& e) {
      ADD_FAILURE() << "the valve failed: " << e.getDescription().cStr();
    });
  }

  std::string address() { return "tcp://127.0.0.1:" + std::to_string(listener->getPort()); }

  // Lets each direction of every connection move up to `bytes` until the next allow(); what a
  // direction leaves unused is not kept, so a direction idle for a while does not move a burst.
  void allow(size_t bytes) {
    for (auto& d : directions) {
      d->allowance = bytes;
      KJ_IF_MAYBE(f, d->waiting) {
        (*f)->fulfill();
        d->waiting = nullptr;
      }
    }
  }

  // Bytes moved so far, both directions together.
  size_t moved() const {
    size_t total = 0;
    for (auto& d : directions) total += d->moved;
    return total;
  }

private:
  struct Direction {
    Direction(kj::Own<kj::AsyncIoStream> from, kj::AsyncIoStream& to)
        : from(kj::mv(from)), to(to) {}
    kj::Own<kj::AsyncIoStream> from;  // owned by the direction that reads from it
    kj::AsyncIoStream& to;
    size_t allowance = 0;
    size_t moved = 0;
    kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiting;
    kj::byte buffer[64 * 1024];
  };

  kj::Promise<void> accept() {
    return listener->accept().then([this](kj::Own<kj::AsyncIoStream> client) {
      return loop.network()
          .parseAddress(target.toKjAddress())
          .then([](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); })
          .then([this, client = kj::mv(client)](kj::Own<kj::AsyncIoStream> server) mutable {
            auto& c = *client;
            auto& s = *server;
            auto up = kj::heap<Direction>(kj::mv(client), s);
            auto down = kj::heap<Direction>(kj::mv(server), c);
            pumps.add(pump(*up).eagerlyEvaluate(nullptr));
            pumps.add(pump(*down).eagerlyEvaluate(nullptr));
            directions.add(kj::mv(up));
            directions.add(kj::mv(down));
            return accept();
          });
    });
  }

  kj::Promise<void> pump(Direction& d) {
    if (d.allowance == 0) {
      auto paf = kj::newPromiseAndFulfiller<void>();
      d.waiting = kj::mv(paf.fulfiller);
      return paf.promise.then([this, &d]() { return pump(d); });
    }
    size_t most = std::min(d.allowance, sizeof(d.buffer));
    return d.from->tryRead(d.buffer, 1, most).then([this, &d](size_t n) -> kj::Promise<void> {
      if (n == 0) {
        d.to.shutdownWrite();
        return kj::READY_NOW;
      }
      d.allowance -= n;
      d.moved += n;
      return d.to.write(d.buffer, n).then([this, &d]() { return pump(d); });
    });
  }

  EventLoop& loop;
  Address target;
  kj::Own<kj::ConnectionReceiver> listener;
  kj::Vector<kj::Own<Direction>> directions;  // before the pumps that use them: dropped after
  kj::Vector<kj::Promise<void>> pumps;
  kj::Promise<void> accepting = nullptr;
};

// One member, reached through a Valve, on a manual clock: the pool pings it every 100 ms of the
// loop's time and gives a ping 100 ms, while the test moves a large message through the valve a
// MiB at a time.
class PoolBusyMemberTest : public ::testing::Test {
protected:
  static constexpr size_t MiB = size_t{1} << 20;
  static constexpr const char* NAME = "job-1/echo-0";

  PoolBusyMemberTest() : loop({.manualClock = true}) {
    JobContext job;
    job.jobId = "job-1";
    server = kj::heap<ActorServer>(loop, job);
    server->host<test::Echo>("echo", kj::heap<test::EchoImpl>());
    valve = kj::heap<Valve>(loop, server->listen("tcp://127.0.0.1:0"));
    Endpoint e;
    e.name = NAME;
    e.address = valve->address();
    e.state = EndpointState::READY;
    resolver.add(e);
    group = kj::heap<ActorGroup<test::Echo>>(loop, resolver, "job-1", "echo");
    group->waitReady(1, 10 * kj::SECONDS).wait(ws());
    pool = kj::heap<ActorPool<test::Echo>>(
        *group, ActorPoolOptions{.probeAfter = 100 * kj::MILLISECONDS,
                                 .probeTimeout = 100 * kj::MILLISECONDS});
  }
  ~PoolBusyMemberTest() noexcept override {}

  kj::WaitScope& ws() { return loop.waitScope(); }

  // An echo of `size` bytes, idempotent: a member given up on would have it sent again.
  kj::Promise<capnp::Response<test::Echo::EchoResults>> echo(size_t size) {
    return pool->call(
        [size](test::Echo::Client c) {
          auto q = c.echoRequest(capnp::MessageSize{size / sizeof(capnp::word) + 16, 0});
          auto data = q.initPayload(size);
          for (size_t i = 0; i < size; i += 4096) data[i] = static_cast<kj::byte>(i / 4096);
          return q.send();
        },
        {.deadline = 60 * kj::SECONDS, .idempotent = true});
  }

  // Moves the loop's clock 10 ms at a time, letting `perStep` bytes through the valve each way
  // before every step, until `promise` settles; false if it has not after `most` steps.
  template <typename T>
  bool stepUntilSettled(kj::Promise<T>& promise, size_t perStep, size_t most) {
    for (size_t step = 0; step < most; ++step) {
      valve->allow(perStep);
      if (promise.poll(ws())) return true;
      loop.advanceTime(10 * kj::MILLISECONDS);
      EXPECT_FALSE(pool->ejected(NAME))
          << "ejected at step " << step << ", " << valve->moved() / MiB << " MiB moved";
      if (pool->ejected(NAME)) return false;
    }
    return promise.poll(ws());
  }

  EventLoop loop;
  FixedResolver resolver;
  kj::Own<ActorServer> server;
  kj::Own<Valve> valve;
  kj::Own<ActorGroup<test::Echo>> group;
  kj::Own<ActorPool<test::Echo>> pool;
};

TEST_F(PoolBusyMemberTest, AMemberMovingALargeMessageEitherWayIsNotEjectedForLatePings) {
  // 64 MiB each way at 1 MiB per 10 ms: about 1.3 s of the loop's time, in which half a dozen pings
  // wait behind the request or the response, each past its 100 ms.
  constexpr size_t SIZE = 64 * MiB;
  auto call = echo(SIZE);
  ASSERT_TRUE(stepUntilSettled(call, 1 * MiB, 1000)) << "the call did not finish";
  EXPECT_GE(valve->moved(), 2 * SIZE);
  auto r = call.wait(ws());
  ASSERT_EQ(r.getPayload().size(), SIZE);
  EXPECT_EQ(r.getPayload()[4096 * 7], 7);
  auto m = pool->metrics();
  EXPECT_EQ(m.sum("troupe_client_attempts_total"), 1) << "the call was sent again";
  EXPECT_EQ(m.sum("troupe_client_attempt_failures_total"), 0);
  EXPECT_FALSE(pool->ejected(NAME));
}

TEST_F(PoolBusyMemberTest, AMemberWhoseLargeMessageStopsMovingIsStillEjected) {
  auto connected = echo(16);  // the connection through the valve is up
  ASSERT_TRUE(stepUntilSettled(connected, 1 * MiB, 100));
  connected.wait(ws());
  auto call = echo(64 * MiB);
  valve->allow(8 * MiB);  // part of the request, then nothing more
  ws().poll();
  // Pings late while bytes moved a moment before they were sent are excused; one sent after
  // more than a probe timeout of stillness is not.
  for (int step = 0; step < 100 && !pool->ejected(NAME); ++step) {
    loop.advanceTime(10 * kj::MILLISECONDS);
    ws().poll();
  }
  EXPECT_TRUE(pool->ejected(NAME));
  EXPECT_FALSE(call.poll(ws()));
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
