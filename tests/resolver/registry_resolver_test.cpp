// RegistryResolver against a RegistryServer in the same process (same loop, real sockets):
// registration, renewal, watches and their reconciliation, refusals, a registry that is down
// at start or restarts.

#include "troupe/resolver/registry_resolver.h"

#include <map>
#include <set>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::endpoint;
using test::next;

std::string registryUrl(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return "registry+unix:" + address.substr(strlen("unix:"));
  return "registry://" + address.substr(strlen("tcp://"));
}

// What a watch's events say the registry holds, checking that they are consistent: ADDED only
// for names not present, CHANGED and REMOVED only for names present.
struct View {
  void apply(const WatchEvent& event) {
    log.push_back(test::describe(event));
    auto& name = event.endpoint.name;
    switch (event.type) {
      case WatchEvent::Type::ADDED:
        if (!entries.emplace(name, event.endpoint).second)
          problems.push_back("ADDED twice " + name);
        break;
      case WatchEvent::Type::CHANGED:
        if (entries.count(name) == 0) problems.push_back("CHANGED absent " + name);
        entries[name] = event.endpoint;
        break;
      case WatchEvent::Type::REMOVED:
        if (entries.erase(name) == 0) problems.push_back("REMOVED absent " + name);
        break;
      case WatchEvent::Type::SYNCED:
        ++synced;
        break;
      case WatchEvent::Type::JOB_ENDED:
        break;
    }
  }

  std::string names() const {
    std::string out;
    for (auto& [name, e] : entries) out += (out.empty() ? "" : ",") + name;
    return out;
  }

  size_t count(const std::string& line) const {
    size_t n = 0;
    for (auto& l : log) n += l == line;
    return n;
  }

  std::map<std::string, Endpoint> entries;
  std::vector<std::string> log;
  std::vector<std::string> problems;
  int synced = 0;
};

// Registry and clients share one loop on a manual clock: leases, renewals and backoffs run when
// the test moves time on.
class RegistryResolverTest : public ::testing::Test {
protected:
  RegistryResolverTest()
      : sink(std::make_shared<test::LineSink>()),
        loop(EventLoopOptions{.logger = test::loggerFor(sink), .manualClock = true}),
        server(kj::heap<RegistryServer>(loop)),
        address(server->listen("tcp://127.0.0.1:0")),
        resolver(kj::heap<RegistryResolver>(loop, registryUrl(address).c_str())) {}
  ~RegistryResolverTest() noexcept override {}

  kj::Own<Registration> registered(Endpoint e, kj::Maybe<Resolver&> through = nullptr) {
    kj::Own<Registration> registration;
    KJ_IF_MAYBE(r, through) {
      registration = r->registerEndpoint(kj::mv(e));
    } else {
      registration = resolver->registerEndpoint(kj::mv(e));
    }
    await(loop, registration->whenRegistered());
    return registration;
  }

  std::shared_ptr<test::LineSink> sink;
  EventLoop loop;
  kj::Own<RegistryServer> server;
  std::string address;
  kj::Own<RegistryResolver> resolver;
};

// ---------------------------------------------------------------------------------------------

TEST_F(RegistryResolverTest, ARegisteredEndpointCanBeResolvedAndWatched) {
  auto e = endpoint("job-1/ps-0", "127.0.0.1:4000", 3);
  e.metadata["rank"] = "0";
  e.registeredAtMillis = 1;  // the registry's clock decides, not the registrant
  // An hour on, so that only the loop's calendar clock can give the time it stamps.
  loop.advanceTime(1 * kj::HOURS);
  auto now = static_cast<uint64_t>((loop.calendarNow() - kj::UNIX_EPOCH) / kj::MILLISECONDS);
  auto registration = registered(e);
  auto found = await(loop, resolver->resolve("job-1/"));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "job-1/ps-0");
  EXPECT_EQ(found[0].address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(found[0].jobId, "job-1");
  EXPECT_EQ(found[0].actor, "ps");
  EXPECT_EQ(found[0].taskIndex, 0u);
  EXPECT_EQ(found[0].incarnation, 3u);
  EXPECT_EQ(found[0].metadata.at("rank"), "0");
  EXPECT_EQ(found[0].registeredAtMillis, now);
  EXPECT_EQ(await(loop, resolver->resolve("job-2/")).size(), 0u);

  auto watch = resolver->watch("job-1/");
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(next(loop, *watch), "SYNCED");
}

TEST_F(RegistryResolverTest, AWatchReportsChangesAsTheyHappen) {
  auto watch = resolver->watch("job-1/");
  EXPECT_EQ(next(loop, *watch), "SYNCED");
  auto a = registered(endpoint("job-1/a-0", "tcp://127.0.0.1:4000", 1, EndpointState::STARTING));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/a-0 starting");
  a->setState(EndpointState::READY);
  EXPECT_EQ(next(loop, *watch), "CHANGED job-1/a-0 ready");
  auto other = registered(endpoint("job-2/a-0"));
  auto b = registered(endpoint("job-1/b-0"));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/b-0 ready");
  a = nullptr;
  EXPECT_EQ(next(loop, *watch), "REMOVED job-1/a-0 ready");
  await(loop, resolver->setJobStatus({"job-1", JobState::ENDED, "done"}));
  EXPECT_EQ(next(loop, *watch), "REMOVED job-1/b-0 ready");
  EXPECT_EQ(next(loop, *watch), "JOB_ENDED job-1 done");
}

TEST_F(RegistryResolverTest, DroppingTheRegistrationRemovesTheEndpointAtOnce) {
  RegistryResolver longLease(loop, registryUrl(address).c_str(), {.ttl = 5 * kj::MINUTES});
  auto registration = registered(endpoint("job/ps-0"), longLease);
  auto watch = resolver->watch("");
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  EXPECT_EQ(next(loop, *watch), "SYNCED");
  registration = nullptr;
  EXPECT_EQ(next(loop, *watch), "REMOVED job/ps-0 ready");
  EXPECT_EQ(server->endpointCount(), 0u);
}

TEST_F(RegistryResolverTest, DroppingARegistrationBeforeTheRegistryAnsweredLeavesNothing) {
  auto watch = resolver->watch("");
  EXPECT_EQ(next(loop, *watch), "SYNCED");  // the connection is up
  auto registration = resolver->registerEndpoint(endpoint("job/ps-0"));
  registration = nullptr;  // the register() call is on its way; its lease comes back unwanted
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
  EXPECT_EQ(next(loop, *watch), "REMOVED job/ps-0 ready");
  EXPECT_EQ(server->endpointCount(), 0u);

  // A registration still waiting for its registry rejects whenRegistered() when dropped.
  RegistryResolver nowhere(loop, ("registry+unix:" + test::socketPath("dropped")).c_str());
  auto waiting = nowhere.registerEndpoint(endpoint("job/ps-1"));
  auto promise = waiting->whenRegistered();
  waiting = nullptr;
  auto e = awaitError(loop, kj::mv(promise));
  EXPECT_EQ(e.code, ErrorCode::DISCONNECTED) << e.text;
}

TEST_F(RegistryResolverTest, AStateSetBeforeTheRegistryAnsweredReachesIt) {
  auto registration = resolver->registerEndpoint(
      endpoint("job/ps-0", "tcp://127.0.0.1:4000", 1, EndpointState::STARTING));
  registration->setState(EndpointState::DRAINING);
  await(loop, registration->whenRegistered());
  auto watch = resolver->watch("");
  View view;
  while (view.synced == 0 || view.entries.count("job/ps-0") == 0 ||
         view.entries["job/ps-0"].state != EndpointState::DRAINING) {
    view.apply(test::nextEvent(loop, *watch));
  }
  EXPECT_TRUE(view.problems.empty());
}

TEST_F(RegistryResolverTest, RefusalsRejectWhenRegistered) {
  auto badName = resolver->registerEndpoint(endpoint("no-slash"));
  auto e = awaitError(loop, badName->whenRegistered());
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  EXPECT_EQ(sink->count("refused registration"), 0u);  // refused before asking the registry

  auto badAddress = resolver->registerEndpoint(endpoint("job/ps-0", "nonsense://x"));
  e = awaitError(loop, badAddress->whenRegistered());
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;

  await(loop, resolver->setJobStatus({"job-9", JobState::ENDED, "finished"}));
  auto ended = resolver->registerEndpoint(endpoint("job-9/a-0"));
  e = awaitError(loop, ended->whenRegistered());
  EXPECT_EQ(e.code, ErrorCode::JOB_ENDED) << e.text;

  auto holder = registered(endpoint("job-1/a-0", "tcp://127.0.0.1:4000", 5));
  for (uint64_t incarnation : {5, 4}) {
    auto twin = resolver->registerEndpoint(
        endpoint("job-1/a-0", "tcp://127.0.0.1:5000", incarnation));
    e = awaitError(loop, twin->whenRegistered());
    EXPECT_EQ(e.code, ErrorCode::NAME_TAKEN) << e.text;
  }
  auto found = await(loop, resolver->resolve(""));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].address, "tcp://127.0.0.1:4000");
}

TEST_F(RegistryResolverTest, RenewalsKeepAShortLeaseAlivePastItsTtl) {
  RegistryResolver shortLease(loop, registryUrl(address).c_str(),
                              {.ttl = 1000 * kj::MILLISECONDS,
                               .renewInterval = 100 * kj::MILLISECONDS});
  auto kept = registered(endpoint("job/kept-0"), shortLease);
  // A clock: a raw lease nobody renews, expiring after two of kept-0's TTLs.
  auto request = server->capability().registerRequest();
  endpoint("job/clock-0").toCapnp(request.initEndpoint());
  request.setTtlMillis(2000);
  auto clock =
      await<capnp::Response<schema::Registry::RegisterResults>>(loop, request.send()).getLease();
  auto watch = resolver->watch("job/");
  EXPECT_EQ(next(loop, *watch), "ADDED job/clock-0 ready");
  EXPECT_EQ(next(loop, *watch), "ADDED job/kept-0 ready");
  EXPECT_EQ(next(loop, *watch), "SYNCED");
  // Two of kept-0's TTLs go by, a renewal interval at a time.
  test::advanceInSteps(loop, 2000 * kj::MILLISECONDS, 100 * kj::MILLISECONDS);
  EXPECT_EQ(test::pending(loop, *watch), "REMOVED job/clock-0 ready");
  EXPECT_EQ(test::pending(loop, *watch), "(none)");  // and not kept-0
  EXPECT_EQ(server->endpointCount(), 1u);
}

TEST_F(RegistryResolverTest, ARegistryThatIsDownAtStartIsWaitedFor) {
  auto path = test::socketPath("late");
  RegistryResolver late(loop, ("registry+unix:" + path).c_str(),
                        {.reconnectBackoffInitial = 20 * kj::MILLISECONDS});
  auto registration = late.registerEndpoint(endpoint("job/late-0"));
  await(loop, sink->whenLogged("cannot register 'job/late-0'"));

  RegistryServer second(loop);
  second.listen(("unix:" + path).c_str());
  // It asks again when its first backoff is over, 10 to 20 ms on (the jitter keeps at least half
  // of reconnectBackoffInitial), and not before. A retry's round trip to a registry on this loop
  // completes within a poll.
  auto registeredNow = registration->whenRegistered();
  loop.advanceTime(10 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(registeredNow.poll(loop.waitScope())) << "it retried before its backoff";
  EXPECT_EQ(second.endpointCount(), 0u);
  loop.advanceTime(10 * kj::MILLISECONDS + 1 * kj::NANOSECONDS);
  ASSERT_TRUE(registeredNow.poll(loop.waitScope())) << "no retry within the backoff";
  await(loop, kj::mv(registeredNow));
  EXPECT_EQ(second.endpointCount(), 1u);
  registration = nullptr;
}

TEST_F(RegistryResolverTest, CallsToAnUnreachableRegistryFailWithUnreachable) {
  RegistryResolver nowhere(loop, ("registry+unix:" + test::socketPath("nowhere")).c_str());
  auto e = awaitError(loop, nowhere.resolve(""));
  EXPECT_EQ(e.code, ErrorCode::UNREACHABLE) << e.text;
  e = awaitError(loop, nowhere.jobStatus("job"));
  EXPECT_EQ(e.code, ErrorCode::UNREACHABLE) << e.text;
  e = awaitError(loop, nowhere.setJobStatus({"job", JobState::ENDED, ""}));
  EXPECT_EQ(e.code, ErrorCode::UNREACHABLE) << e.text;

  // Malformed arguments are refused before anything is sent.
  e = test::thrownBy([&]() { nowhere.resolve("a b"); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  e = test::thrownBy([&]() { nowhere.watch("a\nb"); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  e = test::thrownBy([&]() { nowhere.jobStatus("bad job"); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  e = test::thrownBy([&]() { nowhere.setJobStatus({"", JobState::ENDED, ""}); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
}

TEST_F(RegistryResolverTest, AWatchWithoutTheClusterTokenEndsUnauthenticatedAtOnce) {
  auto token = std::make_shared<Credentials>(CredentialsOptions{.token = "the-cluster-token"});
  RegistryServer guarded(loop, RegistryServerOptions{.credentials = token});
  auto at = guarded.listen("tcp://127.0.0.1:0");
  RegistryResolver stranger(loop, registryUrl(at).c_str(),
                            RegistryResolverOptions{.credentials = Credentials::none()});
  auto watch = stranger.watch("job-1/");
  // Refused, not retried: no time passes on the manual clock.
  auto e = awaitError(loop, watch->next());
  EXPECT_EQ(e.code, ErrorCode::UNAUTHENTICATED) << e.text;

  RegistryResolver member(loop, registryUrl(at).c_str(),
                          RegistryResolverOptions{.credentials = token});
  auto admitted = member.watch("job-1/");
  EXPECT_EQ(next(loop, *admitted), "SYNCED");
}

TEST_F(RegistryResolverTest, JobStatesRoundTrip) {
  EXPECT_EQ(await(loop, resolver->jobStatus("job-7")), (JobStatus{"job-7", JobState::RUNNING, ""}));
  await(loop, resolver->setJobStatus({"job-7", JobState::ENDED, "failed: replica 3 exited 1"}));
  EXPECT_EQ(await(loop, resolver->jobStatus("job-7")),
            (JobStatus{"job-7", JobState::ENDED, "failed: replica 3 exited 1"}));
  await(loop, resolver->setJobStatus({"job-7", JobState::RUNNING, ""}));
  EXPECT_EQ(await(loop, resolver->jobStatus("job-7")).state, JobState::RUNNING);
}

TEST_F(RegistryResolverTest, AWatchOutlivesItsResolver) {
  auto watch = resolver->watch("");
  EXPECT_EQ(next(loop, *watch), "SYNCED");
  resolver = nullptr;
  RegistryResolver other(loop, registryUrl(address).c_str());
  auto registration = registered(endpoint("job/ps-0"), other);
  EXPECT_EQ(next(loop, *watch), "ADDED job/ps-0 ready");
}

// Applies to `view` every event `watch` has ready, without waiting for more.
template <typename V>
void drainInto(EventLoop& loop, Watch& watch, V& view) {
  for (;;) {
    auto event = watch.next();
    if (!event.poll(loop.waitScope())) return;
    view.apply(event.wait(loop.waitScope()));
  }
}

TEST_F(RegistryResolverTest, AfterTheRegistryRestartsRegistrationsReturnAndWatchesReconcile) {
  auto path = test::socketPath("restart");
  auto listen = "unix:" + path;
  auto first = kj::heap<RegistryServer>(loop);
  first->listen(listen.c_str());
  RegistryResolver client(loop, registryUrl(listen).c_str(),
                          {.reconnectBackoffInitial = 20 * kj::MILLISECONDS,
                           .reconnectBackoffMax = 200 * kj::MILLISECONDS});
  auto a = registered(endpoint("job/a-0", "tcp://127.0.0.1:4000", 1), client);
  auto b = registered(endpoint("job/b-0", "tcp://127.0.0.1:4001", 1), client);
  auto watch = client.watch("job/");
  View view;
  for (int i = 0; i < 3; ++i) view.apply(test::nextEvent(loop, *watch));
  ASSERT_EQ(view.names(), "job/a-0,job/b-0");
  ASSERT_EQ(view.synced, 1);
  auto registeredAt = view.entries["job/a-0"].registeredAtMillis;

  first = nullptr;  // the registry goes, and everything it knew with it
  b = nullptr;      // b leaves while it is away
  RegistryServer second(loop);
  second.listen(listen.c_str());

  // The watch comes back with a new snapshot, and a registers again by itself, well within the
  // grace during which the watch keeps what the new registry lacks.
  auto drain = [&]() { drainInto(loop, *watch, view); };
  while (view.synced < 2 || second.endpointCount() < 1) {
    test::advanceInSteps(loop, 10 * kj::MILLISECONDS, 10 * kj::MILLISECONDS);
    drain();
  }
  drain();
  EXPECT_EQ(view.names(), "job/a-0,job/b-0");
  EXPECT_EQ(view.count("REMOVED job/b-0 ready"), 0u);
  // b is reported gone once the grace has passed without it.
  test::advanceInSteps(loop, RegistryResolverOptions{}.reconcileGrace, 100 * kj::MILLISECONDS);
  drain();
  EXPECT_EQ(view.names(), "job/a-0");
  EXPECT_TRUE(view.problems.empty()) << view.problems[0];
  EXPECT_EQ(view.count("REMOVED job/b-0 ready"), 1u);
  EXPECT_EQ(view.count("REMOVED job/a-0 ready"), 0u);
  // a was never down: registering again with the new registry is no change to report, and its
  // age counts from its first registration.
  EXPECT_EQ(view.count("CHANGED job/a-0 ready"), 0u);
  EXPECT_EQ(view.entries["job/a-0"].registeredAtMillis, registeredAt);
  EXPECT_EQ(view.entries["job/a-0"].address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(second.endpointCount(), 1u);
  auto found = await(loop, client.resolve(""));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "job/a-0");
  a = nullptr;
}

// An endpoint a restarted registry lacks is kept for the grace period, unless its job ends
// meanwhile: then it is REMOVED at once, before the JOB_ENDED.
TEST_F(RegistryResolverTest, AMissingEndpointWhoseJobEndsDuringTheGraceIsRemovedAtOnce) {
  auto path = test::socketPath("restart-end");
  auto listen = "unix:" + path;
  auto first = kj::heap<RegistryServer>(loop);
  first->listen(listen.c_str());
  RegistryResolver client(loop, registryUrl(listen).c_str(),
                          {.reconnectBackoffInitial = 20 * kj::MILLISECONDS,
                           .reconnectBackoffMax = 200 * kj::MILLISECONDS});
  auto b = registered(endpoint("other/b-0", "tcp://127.0.0.1:4001", 1), client);
  auto watch = client.watch("");
  View view;
  for (int i = 0; i < 2; ++i) view.apply(test::nextEvent(loop, *watch));
  ASSERT_EQ(view.names(), "other/b-0");

  first = nullptr;
  b = nullptr;
  RegistryServer second(loop);
  second.listen(listen.c_str());
  auto drain = [&]() { drainInto(loop, *watch, view); };
  while (view.synced < 2) {
    test::advanceInSteps(loop, 10 * kj::MILLISECONDS, 10 * kj::MILLISECONDS);
    drain();
  }
  EXPECT_EQ(view.names(), "other/b-0");  // in its grace
  await(loop, client.setJobStatus({"other", JobState::ENDED, "done"}));
  EXPECT_EQ(test::describe(test::nextEvent(loop, *watch)), "REMOVED other/b-0 ready");
  EXPECT_EQ(test::describe(test::nextEvent(loop, *watch)), "JOB_ENDED other done");
}

TEST_F(RegistryResolverTest, AWatchTheRegistryDropsIsResubscribedAndReconciled) {
  // A registry that drops a watcher as soon as two events wait behind a call in flight.
  RegistryServer strict(loop, {.maxQueuedEvents = 1});
  auto strictAddress = strict.listen("tcp://127.0.0.1:0");
  RegistryResolver client(loop, registryUrl(strictAddress).c_str());
  auto a = registered(endpoint("job-1/a-0"), client);
  auto b = registered(endpoint("job-1/b-0"), client);
  auto c = registered(endpoint("job-1/c-0"), client);
  auto bystander = registered(endpoint("job-2/k-0"), client);
  auto watch = client.watch("job-1/");
  View view;
  for (int i = 0; i < 4; ++i) view.apply(test::nextEvent(loop, *watch));
  ASSERT_EQ(view.names(), "job-1/a-0,job-1/b-0,job-1/c-0");

  // Ending the job removes three endpoints at once: the registry falls behind and drops the
  // watch; the client subscribes again and makes up what it missed, JOB_ENDED included.
  await(loop, client.setJobStatus({"job-1", JobState::ENDED, "done"}));
  while (view.synced < 2) view.apply(test::nextEvent(loop, *watch));
  EXPECT_TRUE(view.problems.empty()) << view.problems[0];
  EXPECT_EQ(sink->count("dropped watcher"), 1u);
  std::vector<std::string> tail(view.log.begin() + 4, view.log.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"REMOVED job-1/a-0 ready", "REMOVED job-1/b-0 ready",
                                            "REMOVED job-1/c-0 ready", "JOB_ENDED job-1 done",
                                            "SYNCED"}));
  // Only the watch was affected: the connection, and the registration on it, stayed.
  EXPECT_EQ(sink->count("connection to the registry"), 0u);
  EXPECT_EQ(strict.endpointCount(), 1u);
}

}  // namespace
}  // namespace troupe
