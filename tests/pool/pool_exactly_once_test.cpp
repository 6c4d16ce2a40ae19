// A pool of three test servers in child processes (tests/support/test_server_main.cpp), each
// behind a FaultProxy cutting connections at random from a seed, takes thousands of calls that
// are not idempotent: every call that succeeded ran once, none ran twice, and MAY_HAVE_RUN comes
// only for calls in flight to a member that was killed.

#include <signal.h>

#include <map>
#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/fixed_resolver.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_server.h"

namespace troupe::test {
namespace {

constexpr uint32_t MEMBERS = 3;
constexpr uint32_t CALLS = 3000;
constexpr uint32_t CONCURRENCY = 8;

// Three test servers of job "test", each listed in the resolver as "member" at its proxy.
struct Fleet {
  Fleet(EventLoop& loop, FixedResolver& resolver, double cutProbability) {
    for (uint32_t i = 0; i < MEMBERS; ++i) {
      servers.add(kj::heap<TestServer>(
          std::vector<std::string>{},
          std::vector<std::string>{"TROUPE_TASK_INDEX=" + std::to_string(i),
                                   "TROUPE_NUM_TASKS=" + std::to_string(MEMBERS)}));
      proxies.add(kj::heap<FaultProxy>(loop, servers.back()->address));
      proxies.back()->setRandomFaults(RandomFaults{.seed = 7 + i, .probability = cutProbability});
      Endpoint e;
      e.name = "test/member-" + std::to_string(i);
      e.address = proxies.back()->address();
      e.incarnation = servers.back()->incarnation;
      e.state = EndpointState::READY;
      resolver.add(e);
    }
  }

  // How many calls member `i` ran (Member.calls, asked directly, past its proxy).
  uint64_t ran(EventLoop& loop, uint32_t i) {
    auto direct = ActorRef<Member>::connect(loop, servers[i]->address.c_str(), "member");
    auto count = direct.call([](Member::Client c) { return c.callsRequest().send(); },
                             {.idempotent = true});
    return await(loop, kj::mv(count)).getCount();
  }

  uint64_t cuts() const {
    uint64_t n = 0;
    for (auto& p : proxies) n += p->stats().randomCuts;
    return n;
  }

  kj::Vector<kj::Own<TestServer>> servers;
  kj::Vector<kj::Own<FaultProxy>> proxies;
};

// What the calls came to.
struct Tally {
  std::map<std::string, uint64_t> ranOn;  // successes, by the member that answered
  uint64_t mayHaveRun = 0;
  std::map<std::string, uint64_t> mayHaveRunOn;  // by the member named in the error
  kj::Vector<std::string> otherErrors;
  uint32_t sent = 0;
};

// Sends calls one after another until `CALLS` were sent in all; `midway` runs once, when half
// were.
kj::Promise<void> caller(ActorPool<Member>& pool, Tally& tally, kj::Function<void()>& midway) {
  if (tally.sent == CALLS) return kj::READY_NOW;
  if (++tally.sent == CALLS / 2) midway();
  return pool.call([](Member::Client c) { return c.whoamiRequest().send(); })
      .then([&tally](
                capnp::Response<Member::WhoamiResults>&& r) { ++tally.ranOn[r.getName().cStr()]; },
            [&tally](kj::Exception&& e) {
              std::string text = e.getDescription().cStr();
              if (errorCode(e) != ErrorCode::MAY_HAVE_RUN) {
                tally.otherErrors.add(kj::mv(text));
                return;
              }
              ++tally.mayHaveRun;
              for (uint32_t i = 0; i < MEMBERS; ++i) {
                auto name = "test/member-" + std::to_string(i);
                if (text.find(name) != std::string::npos) ++tally.mayHaveRunOn[name];
              }
            })
      .then([&pool, &tally, &midway]() { return caller(pool, tally, midway); });
}

Tally run(EventLoop& loop, ActorPool<Member>& pool, kj::Function<void()> midway) {
  Tally tally;
  kj::Vector<kj::Promise<void>> callers;
  for (uint32_t i = 0; i < CONCURRENCY; ++i) callers.add(caller(pool, tally, midway));
  await(loop, kj::joinPromises(callers.releaseAsArray()), 10 * PATIENCE);
  return tally;
}

// The fleet behind proxies that cut 1% of messages' connections, and a pool over it.
class PoolExactlyOnce : public ::testing::Test {
protected:
  PoolExactlyOnce() { await(loop, group.waitReady(MEMBERS, 10 * kj::SECONDS)); }
  ~PoolExactlyOnce() noexcept override {}

  EventLoop loop;
  FixedResolver resolver;
  Fleet fleet{loop, resolver, 0.01};
  ActorGroup<Member> group{loop, resolver, "test", "member"};
  ActorPool<Member> pool{group};
};

TEST_F(PoolExactlyOnce, CallsThroughConnectionsCutAtRandomEachRunOnceAndNoneIsInDoubt) {
  auto tally = run(loop, pool, []() {});
  for (auto& e : tally.otherErrors) ADD_FAILURE() << e;
  EXPECT_EQ(tally.mayHaveRun, 0u);
  uint64_t successes = 0;
  for (uint32_t i = 0; i < MEMBERS; ++i) {
    auto name = "test/member-" + std::to_string(i);
    EXPECT_EQ(fleet.ran(loop, i), tally.ranOn[name]) << name << " ran a call twice, or lost one";
    successes += tally.ranOn[name];
  }
  EXPECT_EQ(successes, CALLS);
  // The proxies did cut: a test that cut nothing would prove nothing.
  EXPECT_GT(fleet.cuts(), 50u);
}

TEST_F(PoolExactlyOnce, AMemberKilledMidwayLeavesInDoubtOnlyTheCallsInFlightToIt) {
  auto tally = run(loop, pool, [&]() { fleet.servers[0]->process.kill(SIGKILL); });
  for (auto& e : tally.otherErrors) ADD_FAILURE() << e;
  EXPECT_LE(tally.mayHaveRun, CONCURRENCY);
  EXPECT_EQ(tally.mayHaveRunOn["test/member-0"], tally.mayHaveRun);
  // The members that lived ran each of their calls once.
  for (uint32_t i = 1; i < MEMBERS; ++i) {
    auto name = "test/member-" + std::to_string(i);
    EXPECT_EQ(fleet.ran(loop, i), tally.ranOn[name]) << name << " ran a call twice, or lost one";
  }
  uint64_t successes = 0;
  for (auto& [name, n] : tally.ranOn) successes += n;
  EXPECT_EQ(successes + tally.mayHaveRun, CALLS);
  EXPECT_GT(tally.ranOn["test/member-0"], 0u);
}

}  // namespace
}  // namespace troupe::test
