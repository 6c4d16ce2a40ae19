// Groups and pools over replicas in child processes that publish themselves in a troupe-registry
// daemon (also a child process): members killed, frozen, restarted, and the registry restarted.
// Where a lease's expiry is the subject, the registry runs in this process instead, on a loop
// whose clock the test moves.

#include <signal.h>
#include <sys/wait.h>

#include <set>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/open_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_server.h"

namespace troupe {
namespace {

using test::Echo;
using test::Member;

// Starts replica `index` of job "test" publishing in the registry at `resolverUrl` (a
// TROUPE_RESOLVER value). Returns once it listens; it publishes itself in the background.
kj::Own<test::TestServer> replica(const std::string& resolverUrl, uint32_t index) {
  return kj::heap<test::TestServer>(
      std::vector<std::string>{},
      std::vector<std::string>{"TROUPE_RESOLVER=" + resolverUrl,
                               "TROUPE_TASK_INDEX=" + std::to_string(index), "TROUPE_NUM_TASKS=8"});
}

// Waits (boundedly) until `group` has `count` READY members.
void awaitReadyCount(EventLoop& loop, ActorGroupBase& group, size_t count) {
  while (group.readyCount() != count) test::await(loop, group.whenChanged());
}

kj::Promise<std::string> whoami(ActorPool<Member>& pool, bool idempotent = false) {
  return pool
      .call([](Member::Client c) { return c.whoamiRequest().send(); }, {.idempotent = idempotent})
      .then([](auto r) { return std::string(r.getName().cStr()); });
}

class PoolRegistryTest : public ::testing::Test {
protected:
  PoolRegistryTest()
      : socket("pool"),
        registry(kj::heap<test::RegistryProcess>("unix:" + socket.path)),
        url("registry+unix:" + socket.path),
        resolver(openResolver(loop, url.c_str())) {}
  ~PoolRegistryTest() noexcept override {}

  // Starts replica `index` of job "test" publishing in the registry and waits until it is
  // published.
  kj::Own<test::TestServer> startReplica(uint32_t index) {
    auto server = replica(url, index);
    for (;;) {
      auto line = server->process.readLine();
      if (line == "PUBLISHED") break;
      if (line.empty()) throw std::runtime_error("replica did not publish itself");
    }
    return server;
  }

  EventLoop loop;
  test::TempSocket socket;
  kj::Own<test::RegistryProcess> registry;
  std::string url;
  kj::Own<Resolver> resolver;
};

// A registry in this process, on a loop with a manual clock: its leases run out when the test
// moves the clock, while the replicas registering in it renew on their own real clocks.
struct LocalRegistry {
  LocalRegistry()
      : loop(EventLoopOptions{.manualClock = true}), socket("pool-lease"), server(loop) {
    server.listen(("unix:" + socket.path).c_str());
    url = "registry+unix:" + socket.path;
    resolver = openResolver(loop, url.c_str());
  }

  EventLoop loop;
  test::TempSocket socket;
  RegistryServer server;
  std::string url;
  kj::Own<Resolver> resolver;
};

TEST_F(PoolRegistryTest, AKilledMemberLeavesTheGroupAndThePoolKeepsServing) {
  kj::Vector<kj::Own<test::TestServer>> replicas;
  for (uint32_t i = 0; i < 3; ++i) replicas.add(startReplica(i));
  ActorGroup<Member> group(loop, *resolver, "test", "member");
  test::await(loop, group.waitReady(3, 10 * kj::SECONDS));
  ActorPool<Member> pool(group);

  replicas[1]->process.kill(SIGKILL);
  // Its connection to the registry dropped with it, which removes its entries at once.
  awaitReadyCount(loop, group, 2);
  auto names = group.members();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].name, "test/member-0");
  EXPECT_EQ(names[1].name, "test/member-2");
  kj::Vector<kj::String> seen;
  for (int i = 0; i < 4; ++i) seen.add(kj::str(test::await(loop, whoami(pool)).c_str()));
  EXPECT_EQ(kj::strArray(seen, ","), "test/member-0,test/member-2,test/member-0,test/member-2");
}

// The registry's clock moves only while a is frozen, so a's lease runs out exactly one TTL after
// the last renewal the registry took in, however slow the machine; b's lease (10 s) outlasts
// what the test advances.
TEST(PoolRegistryLeaseTest, AFrozenMemberLeavesWhenItsLeaseExpiresAndReturnsWhenThawed) {
  LocalRegistry registry;
  auto& loop = registry.loop;
  auto a = replica(registry.url + "?ttl_ms=300", 0);  // renews every 100 ms of its own time
  auto b = replica(registry.url, 1);
  ActorGroup<Member> group(loop, *registry.resolver, "test", "member");
  test::await(loop, group.waitReady(2, 10 * kj::SECONDS));

  ASSERT_TRUE(a->process.freeze());  // no renewal comes from the frozen process
  loop.waitScope().poll();           // the renewals it sent before it stopped reach the registry
  loop.advanceTime(300 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  loop.waitScope().poll();
  EXPECT_EQ(test::await(loop, registry.resolver->resolve("test/member-")).size(), 2u);
  EXPECT_EQ(group.readyCount(), 2u);
  // At its TTL the registry drops it, and the group follows.
  loop.advanceTime(1 * kj::NANOSECONDS);
  awaitReadyCount(loop, group, 1);
  EXPECT_EQ(group.members()[0].name, "test/member-1");
  ActorPool<Member> pool(group);
  EXPECT_EQ(test::await(loop, whoami(pool)), "test/member-1");

  // Thawed, it learns its lease was lost and registers again.
  a->process.thaw();
  awaitReadyCount(loop, group, 2);
}

TEST_F(PoolRegistryTest, ARegistryRestartIsReconciledWithoutTheUsersHelp) {
  auto a = startReplica(0);
  auto b = startReplica(1);
  ActorGroup<Member> group(loop, *resolver, "test", "member");
  test::await(loop, group.waitReady(2, 10 * kj::SECONDS));
  ActorPool<Member> pool(group);
  EXPECT_EQ(test::await(loop, whoami(pool)), "test/member-0");

  registry->process.kill(SIGKILL);
  registry->process.wait();
  registry = nullptr;
  registry = kj::heap<test::RegistryProcess>("unix:" + socket.path);

  // The replicas register again by themselves: a fresh watch sees both (and nothing twice).
  auto watch = resolver->watch("test/member-");
  std::set<std::string> present;
  bool synced = false;
  while (!(synced && present.size() == 2)) {
    auto event = test::nextEvent(loop, *watch);
    if (event.type == WatchEvent::Type::ADDED) {
      EXPECT_TRUE(present.insert(event.endpoint.name).second) << event.endpoint.name;
    } else if (event.type == WatchEvent::Type::REMOVED) {
      present.erase(event.endpoint.name);
    } else if (event.type == WatchEvent::Type::SYNCED) {
      synced = true;
    }
  }
  // The group's own watch reconciled too, and the pool kept serving (its connections go to the
  // replicas, not to the registry).
  while (group.readyCount() != 2) test::await(loop, group.whenChanged());
  EXPECT_EQ(group.members().size(), 2u);
  kj::Vector<kj::String> seen;
  for (int i = 0; i < 2; ++i) seen.add(kj::str(test::await(loop, whoami(pool)).c_str()));
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0], seen[1]);
}

TEST_F(PoolRegistryTest, ARestartedReplicaReplacesItsEntryWithTheNewIncarnation) {
  auto old = startReplica(0);
  ActorGroup<Echo> group(loop, *resolver, "test", "echo");
  auto first = test::await(loop, group.waitReady(1, 10 * kj::SECONDS));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].incarnation, old->incarnation);

  // A second process for the same task: its newer incarnation takes the name over.
  auto replacement = startReplica(0);
  ASSERT_GT(replacement->incarnation, old->incarnation);
  while (group.members().size() != 1 ||
         group.members()[0].incarnation != replacement->incarnation || group.readyCount() != 1) {
    test::await(loop, group.whenChanged());
  }
  EXPECT_EQ(group.members()[0].address, replacement->address);
  auto fresh = group.discoverNew();
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].incarnation, replacement->incarnation);

  ActorPool<Echo> pool(group);
  auto who = test::await(loop, pool.call([](Echo::Client c) { return c.whoamiRequest().send(); }));
  EXPECT_EQ(who.getPid(), static_cast<uint32_t>(replacement->process.pid()));
  EXPECT_EQ(who.getIncarnation(), replacement->incarnation);
}

TEST_F(PoolRegistryTest, HostActorRegistersByItselfAndLeavesOnSigterm) {
  test::ChildProcess replica(TROUPE_TEST_HOST_ACTOR_PATH, {},
                             {"TROUPE_RESOLVER=" + url, "TROUPE_JOB_ID=hosted",
                              "TROUPE_TASK_INDEX=2", "TROUPE_NUM_TASKS=3"});
  ActorGroup<Member> group(loop, *resolver, "hosted", "member");
  auto ready = test::await(loop, group.waitReady(1, 10 * kj::SECONDS));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].name, "hosted/member-2");
  ActorPool<Member> pool(group);
  EXPECT_EQ(test::await(loop, whoami(pool)), "hosted/member-2");

  replica.kill(SIGTERM);
  int status = replica.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  while (group.members().size() > 0) test::await(loop, group.whenChanged());
}

TEST_F(PoolRegistryTest, EndingTheJobFailsWaitReadyAtOnce) {
  auto a = startReplica(0);
  ActorGroup<Member> group(loop, *resolver, "test", "member");
  auto waiting = group.waitReady(4, 60 * kj::SECONDS);
  test::await(loop, resolver->setJobStatus({"test", JobState::ENDED, "stopped by the operator"}));
  auto failure = test::awaitError(loop, kj::mv(waiting));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ENDED) << failure.text;
  EXPECT_TRUE(failure.mentions("stopped by the operator")) << failure.text;
}

TEST_F(PoolRegistryTest, AGroupFollowsAJobOfTheSameNameThatRunsAgain) {
  ActorGroup<Member> group(loop, *resolver, "test", "member");
  test::await(loop, resolver->setJobStatus({"test", JobState::ENDED, "first run done"}));
  while (group.jobEnded() == nullptr) test::await(loop, group.whenChanged());

  test::await(loop, resolver->setJobStatus({"test", JobState::RUNNING, ""}));
  auto replica = startReplica(0);
  // The member's registration reaches the group through its watch, and clears the old end.
  while (group.jobEnded() != nullptr) test::await(loop, group.whenChanged());
  auto ready = test::await(loop, group.waitReady(1, 10 * kj::SECONDS));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].name, "test/member-0");
}

}  // namespace
}  // namespace troupe
