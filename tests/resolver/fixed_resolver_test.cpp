// FixedResolver: parsing its spec and file formats, resolve and watch by prefix, registrations,
// and validatePrefix. Everything runs in memory on one loop; nothing touches the network.

#include "troupe/resolver/fixed_resolver.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"

namespace troupe {
namespace {

using Type = WatchEvent::Type;

Endpoint endpoint(std::string name, std::string address,
                  EndpointState state = EndpointState::READY) {
  Endpoint e;
  e.name = kj::mv(name);
  e.address = kj::mv(address);
  e.state = state;
  return e;
}

kj::String namesOf(kj::ArrayPtr<const Endpoint> endpoints) {
  kj::Vector<kj::String> names;
  for (auto& e : endpoints) names.add(kj::str(e.name.c_str()));
  return kj::strArray(names, ",");
}

// "ADDED job-1/ps-0 ready", "SYNCED", ...: one event as a comparable line.
kj::String describe(const WatchEvent& event) {
  if (event.type == Type::SYNCED) return kj::str("SYNCED");
  if (event.type == Type::JOB_ENDED) {
    return kj::str("JOB_ENDED ", event.job.jobId.c_str(), " ", event.job.reason.c_str());
  }
  return kj::str(toString(event.type), " ", event.endpoint.name.c_str(), " ",
                 toString(event.endpoint.state));
}

// The next event, which must already be available (everything FixedResolver does is immediate);
// "(none)" when there is none, rather than waiting forever.
kj::String nextEvent(EventLoop& loop, Watch& watch) {
  auto promise = watch.next();
  if (!promise.poll(loop.waitScope())) return kj::str("(none)");
  return describe(promise.wait(loop.waitScope()));
}

// The result of `promise`, which must already be settled (FixedResolver never makes a caller
// wait): fails with "not settled" rather than waiting forever.
template <typename T>
T settled(EventLoop& loop, kj::Promise<T>& promise) {
  if (!promise.poll(loop.waitScope())) KJ_FAIL_ASSERT("promise not settled");
  return promise.wait(loop.waitScope());
}

template <typename T>
T settled(EventLoop& loop, kj::Promise<T>&& promise) {
  return settled(loop, promise);
}

// Runs `fn` and returns the troupe error it throws; fails the test when it throws nothing.
template <typename Fn>
kj::Exception errorFrom(Fn&& fn) {
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(kj::fwd<Fn>(fn))) {
    return kj::mv(*e);
  }
  ADD_FAILURE() << "expected an exception";
  return KJ_EXCEPTION(FAILED, "nothing thrown");
}

bool mentions(const kj::Exception& e, kj::StringPtr text) {
  return std::string(e.getDescription().cStr()).find(text.cStr()) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// parse()

TEST(FixedResolverParse, SpecBuildsReadyEndpointsFromNamesAndAddresses) {
  EventLoop loop;
  auto resolver = FixedResolver::parse(
      "job-1/ps-1=unix:/tmp/ps1.sock, job-1/ps-0=tcp://127.0.0.1:4000,job-1/worker-12=host:4001");
  auto all = resolver->resolve("").wait(loop.waitScope());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].name, "job-1/ps-0");
  EXPECT_EQ(all[0].address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(all[0].jobId, "job-1");
  EXPECT_EQ(all[0].actor, "ps");
  EXPECT_EQ(all[0].taskIndex, 0u);
  EXPECT_EQ(all[0].state, EndpointState::READY);
  EXPECT_EQ(all[0].incarnation, 0u);
  EXPECT_TRUE(all[0].metadata.empty());
  EXPECT_EQ(all[1].name, "job-1/ps-1");
  EXPECT_EQ(all[1].address, "unix:/tmp/ps1.sock");
  EXPECT_EQ(all[1].taskIndex, 1u);
  // A bare HOST:PORT is stored in canonical form.
  EXPECT_EQ(all[2].name, "job-1/worker-12");
  EXPECT_EQ(all[2].address, "tcp://host:4001");
  EXPECT_EQ(all[2].taskIndex, 12u);
}

TEST(FixedResolverParse, EmptySpecIsAnEmptyTable) {
  EventLoop loop;
  EXPECT_EQ(FixedResolver::parse("")->resolve("").wait(loop.waitScope()).size(), 0u);
}

TEST(FixedResolverParse, EachKindOfBadEntryIsInvalidArgumentNamingIt) {
  struct Case {
    kj::StringPtr spec;
    kj::StringPtr mentions;
  };
  Case cases[] = {
      {"job-1/ps-0=tcp://127.0.0.1:4000,,job-1/ps-1=tcp://127.0.0.1:4001", "entry 2"},
      {"job-1/ps-0=tcp://127.0.0.1:4000,", "empty entry"},
      {"job-1/ps-0", "expected NAME=ADDRESS"},
      {"job-1/ps-0=tcp://127.0.0.1:4000,job-1/ps=tcp://127.0.0.1:4001", "'job-1/ps'"},
      {"bad name/ps-0=tcp://127.0.0.1:4000", "not an endpoint name"},
      {"job-1/ps-0=tcp://127.0.0.1:99999", "port above 65535"},
      {"job-1/ps-0=ftp://host:1", "job-1/ps-0=ftp://host:1"},
      {"job-1/ps-0=tcp://a:1,job-1/ps-0=tcp://b:2", "already given in entry 1"},
  };
  for (auto& c : cases) {
    auto e = errorFrom([&]() { FixedResolver::parse(c.spec); });
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << c.spec.cStr();
    EXPECT_TRUE(mentions(e, c.mentions)) << e.getDescription().cStr();
  }
}

// ---------------------------------------------------------------------------------------------
// parseFile() and fromFile()

constexpr kj::StringPtr FILE_TEXT =
    "# the parameter servers\n"
    "job-1/ps-0   tcp://10.0.0.1:4000\n"
    "\n"
    "job-1/ps-1\tunix:/tmp/ps1.sock\tdraining   # being replaced\r\n"
    "   \t  \n"
    "job-1/worker-0 10.0.0.2:5000 starting zone=a rack=\n"
    "job-1/worker-1 tcp://10.0.0.3:5000 role=chief\n"_kj;

TEST(FixedResolverFile, ReadsStatesAndMetadataAndSkipsCommentsAndBlankLines) {
  EventLoop loop;
  auto resolver = FixedResolver::parseFile(FILE_TEXT, "cluster.txt");
  auto all = resolver->resolve("").wait(loop.waitScope());
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(namesOf(all), "job-1/ps-0,job-1/ps-1,job-1/worker-0,job-1/worker-1");
  EXPECT_EQ(all[0].address, "tcp://10.0.0.1:4000");
  EXPECT_EQ(all[0].state, EndpointState::READY);
  EXPECT_EQ(all[1].address, "unix:/tmp/ps1.sock");
  EXPECT_EQ(all[1].state, EndpointState::DRAINING);
  EXPECT_TRUE(all[1].metadata.empty());
  EXPECT_EQ(all[2].address, "tcp://10.0.0.2:5000");
  EXPECT_EQ(all[2].state, EndpointState::STARTING);
  EXPECT_EQ(all[2].actor, "worker");
  EXPECT_EQ(all[2].metadata, (std::map<std::string, std::string>{{"zone", "a"}, {"rack", ""}}));
  EXPECT_EQ(all[3].state, EndpointState::READY);
  EXPECT_EQ(all[3].metadata, (std::map<std::string, std::string>{{"role", "chief"}}));
}

TEST(FixedResolverFile, ErrorsNameTheSourceAndLine) {
  struct Case {
    kj::StringPtr text;
    kj::StringPtr mentions;
  };
  Case cases[] = {
      {"# ok\njob-1/ps-0\n", "hosts.txt:2: expected NAME ADDRESS"},
      {"job-1/ps-0 tcp://a:1\n\njob-1/ps tcp://a:2\n",
       "hosts.txt:3: 'job-1/ps' is not an endpoint"},
      {"job-1/ps-0 tcp://a:1 ready\njob-1/ps-1 nowhere\n", "hosts.txt:2: bad address 'nowhere'"},
      {"job-1/ps-0 tcp://a:1 serving\n", "hosts.txt:1: unknown state 'serving'"},
      {"job-1/ps-0 tcp://a:1 ready zone=a draining\n", "hosts.txt:1: expected KEY=VALUE"},
      {"job-1/ps-0 tcp://a:1 =x\n", "hosts.txt:1: empty key"},
      {"job-1/ps-0 tcp://a:1 k=1 k=2\n", "hosts.txt:1: key 'k' given twice"},
      {"job-1/ps-0 tcp://a:1\r\n# x\r\njob-1/ps-0 tcp://a:2\r\n",
       "hosts.txt:3: endpoint 'job-1/ps-0' already given on line 1"},
  };
  for (auto& c : cases) {
    auto e = errorFrom([&]() { FixedResolver::parseFile(c.text, "hosts.txt"); });
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << c.text.cStr();
    EXPECT_TRUE(mentions(e, c.mentions)) << e.getDescription().cStr();
  }
}

// A file under /tmp named after this process, removed when the test ends however it ends.
struct TempFile {
  explicit TempFile(kj::StringPtr contents)
      : path(kj::str("/tmp/troupe_fixed_resolver_test_", getpid(), ".txt")) {
    FILE* f = fopen(path.cStr(), "w");
    KJ_ASSERT(f != nullptr, "cannot create", path);
    KJ_ASSERT(fwrite(contents.begin(), 1, contents.size(), f) == contents.size());
    KJ_ASSERT(fclose(f) == 0);
  }
  ~TempFile() { unlink(path.cStr()); }
  kj::String path;
};

TEST(FixedResolverFile, FromFileReadsARealFile) {
  EventLoop loop;
  TempFile file(FILE_TEXT);
  auto resolver = FixedResolver::fromFile(file.path);
  auto workers = resolver->resolve("job-1/worker-").wait(loop.waitScope());
  EXPECT_EQ(namesOf(workers), "job-1/worker-0,job-1/worker-1");
  EXPECT_EQ(workers[0].metadata.at("zone"), "a");
}

TEST(FixedResolverFile, FromFileErrorsCarryThePath) {
  TempFile file("job-1/ps-0 tcp://a:1\njob-1/ps-1\n");
  auto bad = errorFrom([&]() { FixedResolver::fromFile(file.path); });
  EXPECT_EQ(errorCode(bad), ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(bad, kj::str(file.path, ":2: "))) << bad.getDescription().cStr();

  auto missingPath = kj::str("/tmp/troupe_fixed_resolver_test_", getpid(), ".missing");
  auto missing = errorFrom([&]() { FixedResolver::fromFile(missingPath); });
  EXPECT_EQ(errorCode(missing), ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(missing, missingPath)) << missing.getDescription().cStr();
  EXPECT_TRUE(mentions(missing, "No such file or directory")) << missing.getDescription().cStr();
}

// ---------------------------------------------------------------------------------------------
// resolve()

TEST(FixedResolverResolve, ReturnsMatchesSortedByName) {
  EventLoop loop;
  Endpoint table[] = {
      endpoint("job-1/psx-0", "tcp://h:3"), endpoint("job-1/ps-1", "tcp://h:2"),
      endpoint("job-2/ps-0", "tcp://h:4"),  endpoint("job-1/ps-0", "tcp://h:1"),
      endpoint("job-10/ps-0", "tcp://h:5"),
  };
  FixedResolver resolver(table);
  auto& ws = loop.waitScope();
  EXPECT_EQ(namesOf(resolver.resolve("job-1/ps-").wait(ws)), "job-1/ps-0,job-1/ps-1");
  EXPECT_EQ(namesOf(resolver.resolve("job-1/").wait(ws)), "job-1/ps-0,job-1/ps-1,job-1/psx-0");
  EXPECT_EQ(namesOf(resolver.resolve("job-1").wait(ws)),
            "job-1/ps-0,job-1/ps-1,job-1/psx-0,job-10/ps-0");
  EXPECT_EQ(namesOf(resolver.resolve("job-1/ps-1").wait(ws)), "job-1/ps-1");
  EXPECT_EQ(resolver.resolve("job-3/").wait(ws).size(), 0u);
  EXPECT_EQ(resolver.resolve("").wait(ws).size(), 5u);

  // The constructor filled in the parts of each name.
  auto one = resolver.resolve("job-10/").wait(ws);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].jobId, "job-10");
  EXPECT_EQ(one[0].actor, "ps");
  EXPECT_EQ(one[0].address, "tcp://h:5");
}

TEST(FixedResolverResolve, IsReadyImmediately) {
  EventLoop loop;
  FixedResolver resolver;
  resolver.add(endpoint("job-1/ps-0", "tcp://h:1"));
  auto promise = resolver.resolve("job-1/");
  EXPECT_TRUE(promise.poll(loop.waitScope()));
  EXPECT_EQ(promise.wait(loop.waitScope()).size(), 1u);
}

TEST(FixedResolverResolve, AddReplacesAndRemoveDeletes) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  resolver.add(endpoint("job-1/ps-0", "tcp://h:1"));
  resolver.add(endpoint("job-1/ps-0", "tcp://h:2", EndpointState::DRAINING));
  auto found = resolver.resolve("").wait(ws);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].address, "tcp://h:2");
  EXPECT_EQ(found[0].state, EndpointState::DRAINING);

  EXPECT_TRUE(resolver.remove("job-1/ps-0"));
  EXPECT_FALSE(resolver.remove("job-1/ps-0"));
  EXPECT_EQ(resolver.resolve("").wait(ws).size(), 0u);

  auto e = errorFrom([&]() { resolver.add(endpoint("job-1/ps", "tcp://h:1")); });
  EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(resolver.resolve("").wait(ws).size(), 0u);
}

TEST(FixedResolverResolve, BadPrefixIsInvalidArgument) {
  EventLoop loop;
  FixedResolver resolver;
  EXPECT_EQ(errorCode(errorFrom([&]() { resolver.resolve("job 1/"); })),
            ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(errorCode(errorFrom([&]() { resolver.watch("job\n"); })), ErrorCode::INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// watch()

TEST(FixedResolverWatch, SnapshotThenSyncedThenLiveChangesInOrder) {
  EventLoop loop;
  FixedResolver resolver;
  resolver.add(endpoint("job-1/ps-1", "tcp://h:2"));
  resolver.add(endpoint("job-1/ps-0", "tcp://h:1"));
  resolver.add(endpoint("job-1/psx-0", "tcp://h:3"));
  auto watch = resolver.watch("job-1/ps-");

  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-1 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");

  // A next() waiting before the change.
  auto pending = watch->next();
  EXPECT_FALSE(pending.poll(loop.waitScope()));
  resolver.add(endpoint("job-1/ps-2", "tcp://h:4", EndpointState::STARTING));
  auto added = settled(loop, pending);
  EXPECT_EQ(added.type, Type::ADDED);
  EXPECT_EQ(added.endpoint.name, "job-1/ps-2");
  EXPECT_EQ(added.endpoint.address, "tcp://h:4");
  EXPECT_EQ(added.endpoint.actor, "ps");

  // Changes while nobody waits queue up, in order; those outside the prefix, or that change
  // nothing, are not reported.
  resolver.add(endpoint("job-1/ps-2", "tcp://h:4", EndpointState::READY));
  resolver.add(endpoint("job-1/psx-1", "tcp://h:5"));
  resolver.add(endpoint("job-1/ps-2", "tcp://h:4", EndpointState::READY));
  EXPECT_TRUE(resolver.remove("job-1/ps-0"));
  EXPECT_TRUE(resolver.remove("job-1/psx-0"));
  resolver.add(endpoint("job-1/ps-0", "tcp://h:9", EndpointState::DRAINING));
  EXPECT_EQ(nextEvent(loop, *watch), "CHANGED job-1/ps-2 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "REMOVED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 draining");

  auto idle = watch->next();
  EXPECT_FALSE(idle.poll(loop.waitScope()));
}

TEST(FixedResolverWatch, DroppedNextDoesNotLoseTheEvent) {
  EventLoop loop;
  FixedResolver resolver;
  auto watch = resolver.watch("");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");
  {
    auto abandoned = watch->next();
    EXPECT_FALSE(abandoned.poll(loop.waitScope()));
  }
  resolver.add(endpoint("job-1/ps-0", "tcp://h:1"));
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 ready");
}

TEST(FixedResolverWatch, ANextPendingWhenTheWatchIsDroppedRejects) {
  EventLoop loop;
  FixedResolver resolver;
  auto watch = resolver.watch("");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");
  auto pending = watch->next();
  // An event arrives and the watch goes in the same turn, before the pending next() could take
  // it: the promise must not go on into the queue that went with the watch.
  resolver.add(endpoint("job-1/ps-0", "tcp://h:1"));
  watch = nullptr;
  auto e = errorFrom([&]() { pending.wait(loop.waitScope()); });
  EXPECT_EQ(errorCode(e), ErrorCode::FAILED) << e.getDescription().cStr();
  EXPECT_NE(strstr(e.getDescription().cStr(), "the watch was dropped"), nullptr);
}

TEST(FixedResolverWatch, EachWatchSeesItsOwnPrefixAndADroppedWatchUnhooks) {
  EventLoop loop;
  FixedResolver resolver;
  auto ps = resolver.watch("job-1/ps-");
  auto everything = resolver.watch("");
  auto dropped = resolver.watch("job-1/");
  EXPECT_EQ(nextEvent(loop, *ps), "SYNCED");
  EXPECT_EQ(nextEvent(loop, *everything), "SYNCED");
  dropped = nullptr;

  resolver.add(endpoint("job-1/worker-0", "tcp://h:1"));
  resolver.add(endpoint("job-1/ps-0", "tcp://h:2"));
  EXPECT_EQ(nextEvent(loop, *ps), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *everything), "ADDED job-1/worker-0 ready");
  EXPECT_EQ(nextEvent(loop, *everything), "ADDED job-1/ps-0 ready");
}

TEST(FixedResolverWatch, WatchOutlivingItsResolverRejectsWithDisconnected) {
  EventLoop loop;
  auto resolver = kj::heap<FixedResolver>();
  auto waiting = resolver->watch("job-1/");
  auto queued = resolver->watch("job-1/");
  EXPECT_EQ(nextEvent(loop, *waiting), "SYNCED");
  EXPECT_EQ(nextEvent(loop, *queued), "SYNCED");
  auto pending = waiting->next();
  EXPECT_FALSE(pending.poll(loop.waitScope()));
  resolver->add(endpoint("job-1/ps-0", "tcp://h:1"));
  EXPECT_EQ(describe(settled(loop, pending)), "ADDED job-1/ps-0 ready");
  resolver->remove("job-1/ps-0");
  EXPECT_EQ(nextEvent(loop, *waiting), "REMOVED job-1/ps-0 ready");
  auto stillPending = waiting->next();
  EXPECT_FALSE(stillPending.poll(loop.waitScope()));

  resolver = nullptr;

  auto pendingError = errorFrom([&]() { settled(loop, stillPending); });
  EXPECT_EQ(errorCode(pendingError), ErrorCode::DISCONNECTED)
      << pendingError.getDescription().cStr();
  auto laterError = errorFrom([&]() { settled(loop, waiting->next()); });
  EXPECT_EQ(errorCode(laterError), ErrorCode::DISCONNECTED);

  // Events queued before the resolver went are still delivered, then the watch ends.
  EXPECT_EQ(nextEvent(loop, *queued), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *queued), "REMOVED job-1/ps-0 ready");
  auto drainedError = errorFrom([&]() { settled(loop, queued->next()); });
  EXPECT_EQ(errorCode(drainedError), ErrorCode::DISCONNECTED);
}

// ---------------------------------------------------------------------------------------------
// registerEndpoint()

TEST(FixedResolverRegistration, SetStateChangesAndDropRemoves) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  auto watch = resolver.watch("job-1/");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");

  auto registration = resolver.registerEndpoint(
      endpoint("job-1/ps-0", "tcp://h:1", EndpointState::STARTING));
  auto registered = registration->whenRegistered();
  settled(loop, registered);
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 starting");
  auto found = resolver.resolve("job-1/ps-0").wait(ws);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].jobId, "job-1");
  EXPECT_EQ(found[0].state, EndpointState::STARTING);

  registration->setState(EndpointState::READY);
  registration->setState(EndpointState::READY);  // no change, no event
  registration->setState(EndpointState::DRAINING);
  EXPECT_EQ(resolver.resolve("job-1/ps-0").wait(ws)[0].state, EndpointState::DRAINING);

  registration = nullptr;
  EXPECT_EQ(resolver.resolve("job-1/").wait(ws).size(), 0u);
  EXPECT_EQ(nextEvent(loop, *watch), "CHANGED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "CHANGED job-1/ps-0 draining");
  EXPECT_EQ(nextEvent(loop, *watch), "REMOVED job-1/ps-0 draining");
}

TEST(FixedResolverRegistration, DroppingAnOlderRegistrationLeavesTheNewerEntry) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  auto older = resolver.registerEndpoint(endpoint("job-1/ps-0", "tcp://old:1"));
  auto newer = resolver.registerEndpoint(endpoint("job-1/ps-0", "tcp://new:1"));
  auto watch = resolver.watch("");
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");

  older->setState(EndpointState::DRAINING);  // no longer its entry: ignored
  older = nullptr;
  auto found = resolver.resolve("").wait(ws);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].address, "tcp://new:1");
  EXPECT_EQ(found[0].state, EndpointState::READY);

  // add() takes the entry over from a registration too.
  resolver.add(endpoint("job-1/ps-0", "tcp://static:1"));
  newer = nullptr;
  found = resolver.resolve("").wait(ws);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].address, "tcp://static:1");

  EXPECT_EQ(nextEvent(loop, *watch), "CHANGED job-1/ps-0 ready");
  auto idle = watch->next();
  EXPECT_FALSE(idle.poll(ws));
}

TEST(FixedResolverRegistration, InvalidNameRejectsAndAddsNothing) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  auto watch = resolver.watch("");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");

  auto registration = resolver.registerEndpoint(endpoint("job 1/ps-0", "tcp://h:1"));
  auto e = errorFrom([&]() { settled(loop, registration->whenRegistered()); });
  EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(e, "not an endpoint name")) << e.getDescription().cStr();
  registration->setState(EndpointState::DRAINING);
  registration = nullptr;

  EXPECT_EQ(resolver.resolve("").wait(ws).size(), 0u);
  auto idle = watch->next();
  EXPECT_FALSE(idle.poll(ws));
}

TEST(FixedResolverRegistration, RegistrationOutlivingItsResolverIsHarmless) {
  EventLoop loop;
  auto resolver = kj::heap<FixedResolver>();
  auto registration = resolver->registerEndpoint(endpoint("job-1/ps-0", "tcp://h:1"));
  resolver = nullptr;
  registration->setState(EndpointState::DRAINING);
  settled(loop, registration->whenRegistered());
  registration = nullptr;
}

// ---------------------------------------------------------------------------------------------
// validatePrefix()

// ---------------------------------------------------------------------------------------------
// Job states

TEST(FixedResolverJobs, EndingAJobRemovesItsEndpointsAndRefusesNewOnes) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  FixedResolver resolver;
  EXPECT_EQ(resolver.jobStatus("job-1").wait(ws).state, JobState::RUNNING);
  auto reg = resolver.registerEndpoint(endpoint("job-1/ps-0", "tcp://h:1", EndpointState::READY));
  resolver.add(endpoint("job-2/ps-0", "tcp://h:2", EndpointState::READY));
  auto watch = resolver.watch("job-1/ps-");
  auto other = resolver.watch("job-2/");
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "SYNCED");
  EXPECT_EQ(nextEvent(loop, *other), "ADDED job-2/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *other), "SYNCED");

  resolver.setJobStatus({"job-1", JobState::ENDED, "completed"}).wait(ws);
  EXPECT_EQ(nextEvent(loop, *watch), "REMOVED job-1/ps-0 ready");
  EXPECT_EQ(nextEvent(loop, *watch), "JOB_ENDED job-1 completed");
  EXPECT_EQ(nextEvent(loop, *other), "(none)");
  auto status = resolver.jobStatus("job-1").wait(ws);
  EXPECT_EQ(status.state, JobState::ENDED);
  EXPECT_EQ(status.reason, "completed");
  EXPECT_EQ(resolver.resolve("").wait(ws).size(), 1u);

  auto late = resolver.registerEndpoint(endpoint("job-1/ps-1", "tcp://h:3", EndpointState::READY));
  auto e = errorFrom([&]() { late->whenRegistered().wait(ws); });
  EXPECT_EQ(errorCode(e), ErrorCode::JOB_ENDED) << e.getDescription().cStr();
  EXPECT_EQ(errorCode(errorFrom([&]() {
              resolver.add(endpoint("job-1/ps-2", "tcp://h:4", EndpointState::READY));
            })),
            ErrorCode::JOB_ENDED);
  reg = nullptr;  // its entry is already gone: nothing more happens
  EXPECT_EQ(nextEvent(loop, *watch), "(none)");

  // Running again, the job's replicas may register anew.
  resolver.setJobStatus({"job-1", JobState::RUNNING, ""}).wait(ws);
  auto again = resolver.registerEndpoint(endpoint("job-1/ps-0", "tcp://h:5", EndpointState::READY));
  again->whenRegistered().wait(ws);
  EXPECT_EQ(nextEvent(loop, *watch), "ADDED job-1/ps-0 ready");
}

TEST(JobOverlapsPrefix, MatchesTheJobsNamespaceOnly) {
  EXPECT_TRUE(jobOverlapsPrefix("job-1", "job-1/ps-"));
  EXPECT_TRUE(jobOverlapsPrefix("job-1", "job-1/"));
  EXPECT_TRUE(jobOverlapsPrefix("job-1", "job-"));
  EXPECT_TRUE(jobOverlapsPrefix("job-1", ""));
  EXPECT_FALSE(jobOverlapsPrefix("job-1", "job-10/"));
  EXPECT_FALSE(jobOverlapsPrefix("job-10", "job-1/"));
  EXPECT_FALSE(jobOverlapsPrefix("job-1", "job-2"));
}

TEST(ValidatePrefix, AcceptsPrintableAsciiUpToTheLimit) {
  validatePrefix("");
  validatePrefix("job-1/");
  validatePrefix("job-1/ps-0");
  validatePrefix("!~{}#=:/");
  validatePrefix(kj::heapString(std::string(MAX_PREFIX_LENGTH, 'a').c_str()));
}

TEST(ValidatePrefix, RefusesTooLongSpacesControlAndNonAscii) {
  struct Case {
    std::string prefix;
    std::string mentions;
  };
  Case cases[] = {
      {std::string(MAX_PREFIX_LENGTH + 1, 'a'),
       std::to_string(MAX_PREFIX_LENGTH + 1) + " bytes long"},
      {"job 1/", "0x20 (a space) at offset 3"},
      {"job-1/\t", "0x09 (a control character) at offset 6"},
      {"job-1/\x7f", "0x7f"},
      {"job-\xc3\xa9", "(not ASCII) at offset 4"},
  };
  for (auto& c : cases) {
    auto e = errorFrom([&]() { validatePrefix(kj::StringPtr(c.prefix.c_str(), c.prefix.size())); });
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT);
    EXPECT_TRUE(mentions(e, c.mentions.c_str())) << e.getDescription().cStr();
  }
}

}  // namespace
}  // namespace troupe
