// The registry across processes: the troupe-registry daemon and registrant processes
// (tests/support/test_registrant_main.cpp) in children, watched from this process. Covers a
// registrant that dies or freezes, a daemon that starts late, is SIGKILLed and restarted, or is
// stopped with SIGTERM.
//
// This process's loop keeps time by hand: its clients' backoffs, and the leases of a registry it
// runs itself, come due when a test moves the clock. The children run on their own real clocks;
// their start, death, stop and output are the events a test waits for.

#include <signal.h>
#include <sys/wait.h>

#include <set>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::await;
using test::endpoint;
using test::next;
using test::RegistryProcess;

// "registry+unix:/path" for "unix:/path", "registry://h:p" for "tcp://h:p".
std::string registryUrl(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return "registry+unix:" + address.substr(strlen("unix:"));
  return "registry://" + address.substr(strlen("tcp://"));
}

// A registrant process for `name`, registering with the registry at `url`.
test::ChildProcess registrant(const std::string& url, const std::string& name,
                              std::vector<std::string> extra = {}) {
  std::vector<std::string> args{url, name};
  args.insert(args.end(), extra.begin(), extra.end());
  return test::ChildProcess(TROUPE_TEST_REGISTRANT_PATH, args);
}

// Names present according to a watch's events, checked for consistency.
struct View {
  void apply(const WatchEvent& event) {
    auto line = test::describe(event);
    log.push_back(line);
    auto& name = event.endpoint.name;
    if (event.type == WatchEvent::Type::ADDED) {
      if (!names.insert(name).second) problems.push_back("duplicate " + line);
    } else if (event.type == WatchEvent::Type::REMOVED || event.type == WatchEvent::Type::CHANGED) {
      if (names.count(name) == 0) problems.push_back("unknown " + line);
      if (event.type == WatchEvent::Type::REMOVED) names.erase(name);
    } else if (event.type == WatchEvent::Type::SYNCED) {
      ++synced;
    }
  }
  std::string list() const {
    std::string out;
    for (auto& n : names) out += (out.empty() ? "" : ",") + n;
    return out;
  }
  size_t count(const std::string& line) const {
    size_t n = 0;
    for (auto& l : log) n += l == line;
    return n;
  }
  std::set<std::string> names;
  std::vector<std::string> log;
  std::vector<std::string> problems;
  int synced = 0;
};

class RegistryProcessTest : public ::testing::Test {
protected:
  RegistryProcessTest()
      : sink(std::make_shared<test::LineSink>()),
        loop(EventLoopOptions{.logger = test::loggerFor(sink), .manualClock = true}) {}
  ~RegistryProcessTest() noexcept override {}

  kj::Own<Registration> registered(Resolver& resolver, Endpoint e) {
    auto registration = resolver.registerEndpoint(kj::mv(e));
    await(loop, registration->whenRegistered());
    return registration;
  }

  static int exitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

  std::shared_ptr<test::LineSink> sink;
  EventLoop loop;
};

// ---------------------------------------------------------------------------------------------

TEST_F(RegistryProcessTest, TheDaemonServesAndExitsZeroOnSigterm) {
  RegistryProcess registry("tcp://127.0.0.1:0");
  RegistryResolver client(loop, registryUrl(registry.address).c_str());
  auto registration = registered(client, endpoint("job/ps-0"));
  auto found = await(loop, client.resolve(""));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "job/ps-0");
  registration = nullptr;

  registry.process.kill(SIGTERM);
  EXPECT_EQ(exitCode(registry.process.wait()), 0);
}

TEST_F(RegistryProcessTest, TheDaemonExitsOneWhenItCannotListen) {
  test::TempSocket socket("taken");
  auto listen = "unix:" + socket.path;
  RegistryProcess first(listen);
  test::ChildProcess second(TROUPE_REGISTRY_PATH, {"--listen", listen});
  EXPECT_EQ(exitCode(second.wait()), 1);
  test::ChildProcess bad(TROUPE_REGISTRY_PATH, {"--frobnicate", "1"});
  EXPECT_EQ(exitCode(bad.wait()), 2);
}

TEST_F(RegistryProcessTest, AKilledRegistrantIsRemovedAtOnce) {
  test::TempSocket socket("killed");
  RegistryProcess registry("unix:" + socket.path);
  auto url = registryUrl(registry.address);
  RegistryResolver client(loop, url.c_str());
  auto watch = client.watch("job/");
  EXPECT_EQ(next(loop, *watch), "SYNCED");

  // A five-minute lease: only the closed connection can explain a prompt removal.
  auto child = registrant(url, "job/ps-0", {"--ttl-ms", "300000"});
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  EXPECT_EQ(child.readLine(), "REGISTERED job/ps-0");
  child.kill(SIGKILL);
  child.wait();
  EXPECT_EQ(next(loop, *watch), "REMOVED job/ps-0 ready");
}

// A registrant that asks for no TTL gets the registry's default (troupe registry
// --default-ttl) and renews within it: frozen, it leaves one default TTL after its last
// renewal.
TEST_F(RegistryProcessTest, ARegistrantAskingForNoTtlGetsTheRegistrysDefault) {
  test::TempSocket socket("default-ttl");
  RegistryServer server(loop, {.defaultTtl = 300 * kj::MILLISECONDS});
  auto url = registryUrl(server.listen(("unix:" + socket.path).c_str()));
  RegistryResolver client(loop, url.c_str());
  auto watch = client.watch("job/");
  EXPECT_EQ(next(loop, *watch), "SYNCED");
  auto child = registrant(url, "job/ps-0", {});  // renews every 100 ms of its own time
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  ASSERT_TRUE(child.freeze());
  loop.waitScope().poll();
  loop.advanceTime(300 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_EQ(test::pending(loop, *watch), "(none)");
  loop.advanceTime(1 * kj::NANOSECONDS);
  EXPECT_EQ(next(loop, *watch), "REMOVED job/ps-0 ready");
  child.thaw();
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  child.kill(SIGTERM);
  EXPECT_EQ(exitCode(child.wait()), 0);
}

// The registry runs in this process, so that its lease TTLs pass on the test's clock; the
// registrant is a child renewing every 20 ms of its own time. The test moves its clock only while
// the child is frozen: no renewal can be missed by a slow machine, and the lease runs out exactly
// one TTL after the last renewal the registry took in.
TEST_F(RegistryProcessTest, AFrozenRegistrantExpiresAfterItsTtlAndReturnsWhenThawed) {
  test::TempSocket socket("frozen");
  RegistryServer server(loop);
  auto url = registryUrl(server.listen(("unix:" + socket.path).c_str()));
  RegistryResolver client(loop, url.c_str());
  auto watch = client.watch("job/");
  EXPECT_EQ(next(loop, *watch), "SYNCED");

  auto child = registrant(url, "job/ps-0", {"--ttl-ms", "1000", "--renew-ms", "20"});
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  ASSERT_TRUE(child.freeze());  // its connection stays open, its renewals stop
  loop.waitScope().poll();      // the renewals it sent before it stopped reach the registry
  // The clock has not moved since the registration: the lease lasts one TTL from now.
  loop.advanceTime(1000 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_EQ(test::pending(loop, *watch), "(none)");
  EXPECT_EQ(server.endpointCount(), 1u);
  loop.advanceTime(1 * kj::NANOSECONDS);
  EXPECT_EQ(next(loop, *watch), "REMOVED job/ps-0 ready");
  EXPECT_EQ(server.endpointCount(), 0u);
  child.thaw();  // its next renewal (within 20 ms) finds the lease lost; it registers again
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  child.kill(SIGTERM);
  EXPECT_EQ(exitCode(child.wait()), 0);
  EXPECT_EQ(next(loop, *watch), "REMOVED job/ps-0 ready");
}

TEST_F(RegistryProcessTest, ARefusedRegistrantSaysWhy) {
  test::TempSocket socket("refused");
  RegistryProcess registry("unix:" + socket.path);
  auto url = registryUrl(registry.address);
  RegistryResolver client(loop, url.c_str());
  await(loop, client.setJobStatus({"job", JobState::ENDED, "completed"}));
  auto child = registrant(url, "job/ps-0");
  auto line = child.readLine();
  EXPECT_EQ(line.rfind("REFUSED job_ended ", 0), 0u) << line;
  EXPECT_EQ(exitCode(child.wait()), 3);
}

TEST_F(RegistryProcessTest, ADaemonStartedLaterIsWaitedFor) {
  test::TempSocket socket("later");
  auto& path = socket.path;
  RegistryResolver client(loop, ("registry+unix:" + path).c_str(),
                          {.reconnectBackoffInitial = 20 * kj::MILLISECONDS});
  auto registration = client.registerEndpoint(endpoint("job/ps-0"));
  await(loop, sink->whenLogged("cannot register 'job/ps-0'"));

  RegistryProcess registry("unix:" + path);
  // The client asks again when its first backoff is over, 10 to 20 ms on (the jitter keeps at
  // least half of reconnectBackoffInitial), and not before. A retry due by then sends its
  // register() in the poll, ahead of this resolve() on their one connection to the daemon.
  loop.advanceTime(10 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  loop.waitScope().poll();
  EXPECT_EQ(await(loop, client.resolve("")).size(), 0u) << "it retried before its backoff";
  loop.advanceTime(10 * kj::MILLISECONDS + 1 * kj::NANOSECONDS);
  await(loop, registration->whenRegistered());
  auto found = await(loop, client.resolve(""));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "job/ps-0");
}

TEST_F(RegistryProcessTest,
       AfterTheDaemonIsKilledAndRestartedRegistrationsReturnAndWatchesReconcile) {
  test::TempSocket socket("restart");
  auto& path = socket.path;
  auto listen = "unix:" + path;
  auto url = "registry+unix:" + path;
  auto first = kj::heap<RegistryProcess>(listen);
  RegistryResolver client(loop, url.c_str(),
                          {.reconnectBackoffInitial = 20 * kj::MILLISECONDS,
                           .reconnectBackoffMax = 200 * kj::MILLISECONDS});
  auto a = registered(client, endpoint("job/a-0", "tcp://127.0.0.1:4000"));
  auto b = registered(client, endpoint("job/b-0", "tcp://127.0.0.1:4001"));
  auto c = registrant(url, "job/c-0", {"--address", "tcp://127.0.0.1:4002"});
  auto watch = client.watch("job/");
  View view;
  while (view.synced < 1 || view.list() != "job/a-0,job/b-0,job/c-0") {
    view.apply(test::nextEvent(loop, *watch));
  }
  int syncedBefore = view.synced;

  first->process.kill(SIGKILL);  // no goodbye: its socket file stays behind
  first->process.wait();
  first = nullptr;
  b = nullptr;  // b leaves while the registry is away
  // The client finds the registry gone: a's registration and the watch ask again at once, find
  // nothing listening, and wait out their first backoff.
  await(loop, sink->whenLogged("cannot register 'job/a-0'"));
  await(loop, sink->whenLogged("watch on 'job/': subscribing failed"));
  RegistryProcess second(listen);
  // Just short of the shortest first backoff (half of reconnectBackoffInitial) a has not asked
  // again: a retry due by then would send its register() in the poll, ahead of this resolve().
  loop.advanceTime(10 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  loop.waitScope().poll();
  EXPECT_EQ(await(loop, client.resolve("job/a-")).size(), 0u) << "a retried before its backoff";
  loop.advanceTime(10 * kj::MILLISECONDS + 1 * kj::NANOSECONDS);  // past the longest

  // Without anyone asking, a (on this process's clock) and c (on its own) register again, and
  // the watch comes back with a snapshot of the new registry, reconciled against what it had
  // reported: what the registry lacks stays in the view for the grace period, so a and c, back
  // within it, cause no event at all.
  auto drain = [&]() {
    for (;;) {
      auto event = watch->next();
      if (!event.poll(loop.waitScope())) return;
      view.apply(event.wait(loop.waitScope()));
    }
  };
  while (await(loop, client.resolve("job/a-")).size() == 0) {
    loop.advanceTime(10 * kj::MILLISECONDS);
    loop.waitScope().poll();
  }
  while (await(loop, client.resolve("job/")).size() < 2) drain();  // c, in real time
  while (view.synced <= syncedBefore) view.apply(test::nextEvent(loop, *watch));
  drain();
  EXPECT_EQ(view.list(), "job/a-0,job/b-0,job/c-0");
  for (auto& line : view.log) EXPECT_NE(line.rfind("REMOVED", 0), 0u) << line;
  // Past the grace, b is reported gone.
  loop.advanceTime(RegistryResolverOptions{}.reconcileGrace);
  while (view.list() != "job/a-0,job/c-0") view.apply(test::nextEvent(loop, *watch));
  EXPECT_TRUE(view.problems.empty()) << view.problems[0];
  EXPECT_EQ(view.count("REMOVED job/b-0 ready"), 1u);
  EXPECT_EQ(view.count("REMOVED job/a-0 ready") + view.count("REMOVED job/c-0 ready"), 0u);
  auto found = await(loop, client.resolve("job/"));
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].name, "job/a-0");
  EXPECT_EQ(found[0].address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(found[1].name, "job/c-0");
  EXPECT_EQ(found[1].address, "tcp://127.0.0.1:4002");
}

}  // namespace
}  // namespace troupe
