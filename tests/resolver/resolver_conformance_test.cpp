// The behaviour every Resolver promises (resolver/resolver.h), written once and run against each
// kind of resolver: registrations seen by resolve() and by watches (snapshot, SYNCED, live
// changes), removal when a registration goes, incarnations, job states and ownership, and the
// refusals with their error codes. Each kind is a Backend below; a test talks to it only
// through Resolver clients, several at once, as separate processes would.
//
// Every wait is on an event (a promise, a watch's next event) with a real-time bound, never on
// a clock: the suite runs the same on a loop whose clock stands still and on real time. To show
// that something did NOT happen, a test makes a later change through the same client and checks
// that the watch reports that one next: a client's changes take effect in the order it makes
// them, and a watch reports them in that order.

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/etcd_resolver.h"
#include "troupe/resolver/fixed_resolver.h"
#include "troupe/resolver/open_resolver.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::endpoint;
using test::Failure;
using test::next;

using Lines = std::vector<std::string>;

// ---------------------------------------------------------------------------------------------
// Backends

// One kind of resolver with whatever serves it (a registry, a table, an etcd cluster), made
// fresh for each test and owned by it. Its loop is the test's; the backend makes it, first, and
// destroys it last. What the suite needs of a backend: that nothing expires or retries during a
// test unless the test makes it (a clock that stands still, or leases far longer than a test),
// so that every event a test sees comes from what the test did.
class Backend {
public:
  virtual ~Backend() noexcept(false) = default;

  // The loop every client, watch, registration and promise of the test belongs to.
  virtual EventLoop& loop() = 0;

  // A new client of the backend's one store, owned by the caller and dropped before the
  // backend: what one client publishes, every other sees. Its registrations present the job
  // credential `jobToken` for job `jobId` (none when empty), as a replica's would.
  virtual kj::Own<Resolver> client(std::string jobId = {}, std::string jobToken = {}) = 0;

  // Whether registrations under a job made with createJob() are refused PERMISSION_DENIED
  // without the job's credential. (Setting a created job's state needs it everywhere.)
  virtual bool hasJobOwnership() const = 0;

  // Whether a registration is refused NAME_TAKEN while a live one holds the name with the same
  // or a newer incarnation.
  virtual bool refusesOlderIncarnations() const = 0;
};

// RegistryResolver clients, each with its own connection, of a RegistryServer on a unix socket
// in this process. With `manualClock`, as the registry's own tests run: leases never expire and
// nothing renews unless a test moves the clock, which no test here does.
class RegistryBackend final : public Backend {
public:
  explicit RegistryBackend(bool manualClock)
      : loop_(EventLoopOptions{.manualClock = manualClock}),
        socket("conformance"),
        server(loop_, RegistryServerOptions{.credentials = Credentials::none()}) {
    setLoopCredentials(loop_, Credentials::none());
    server.listen(("unix:" + socket.path).c_str());
  }

  EventLoop& loop() override { return loop_; }

  kj::Own<Resolver> client(std::string jobId, std::string jobToken) override {
    RegistryResolverOptions options;
    if (!jobId.empty()) {
      options.credentials = std::make_shared<Credentials>(
          CredentialsOptions{.jobId = kj::mv(jobId), .jobToken = kj::mv(jobToken)});
    }
    return kj::heap<RegistryResolver>(loop_, ("registry+unix:" + socket.path).c_str(), options);
  }

  bool hasJobOwnership() const override { return true; }
  bool refusesOlderIncarnations() const override { return true; }

private:
  EventLoop loop_;
  test::TempSocket socket;
  RegistryServer server;
};

// A FixedResolver's table, shared by every client as one process's resolver is by all its
// components: each client is a view that forwards to it.
class FixedBackend final : public Backend {
public:
  EventLoop& loop() override { return loop_; }

  kj::Own<Resolver> client(std::string, std::string) override { return kj::heap<View>(table); }

  // Registrations are this process's own, and need no credential.
  bool hasJobOwnership() const override { return false; }
  // A registration takes the name over, whatever the incarnation.
  bool refusesOlderIncarnations() const override { return false; }

private:
  class View final : public Resolver {
  public:
    explicit View(FixedResolver& table) : table(table) {}
    kj::Promise<kj::Array<Endpoint>> resolve(kj::StringPtr prefix) override {
      return table.resolve(prefix);
    }
    kj::Own<Watch> watch(kj::StringPtr prefix) override { return table.watch(prefix); }
    kj::Own<Registration> registerEndpoint(Endpoint endpoint) override {
      return table.registerEndpoint(kj::mv(endpoint));
    }
    kj::Promise<JobStatus> jobStatus(kj::StringPtr jobId) override {
      return table.jobStatus(jobId);
    }
    kj::Promise<void> setJobStatus(JobStatus status, std::string jobCredential) override {
      return table.setJobStatus(kj::mv(status), kj::mv(jobCredential));
    }
    kj::Promise<std::string> createJob(kj::StringPtr jobId, JobDescription description) override {
      return table.createJob(jobId, kj::mv(description));
    }
    kj::Promise<kj::Array<JobInfo>> jobs() override { return table.jobs(); }

  private:
    FixedResolver& table;
  };

  EventLoop loop_;
  FixedResolver table;
};

// EtcdResolver clients of a real etcd (tests/support/etcd_cluster.h), one member, on real time,
// with leases far longer than a test so that nothing expires unless a test makes it.
class EtcdBackend final : public Backend {
public:
  EtcdBackend() { setLoopCredentials(loop_, Credentials::none()); }

  EventLoop& loop() override { return loop_; }

  kj::Own<Resolver> client(std::string jobId, std::string jobToken) override {
    auto options = EtcdResolver::parseUrl(cluster.url("troupe", 10 * 60 * 1000).c_str());
    if (!jobId.empty()) {
      options.credentials = std::make_shared<Credentials>(
          CredentialsOptions{.jobId = kj::mv(jobId), .jobToken = kj::mv(jobToken)});
    }
    return kj::heap<EtcdResolver>(loop_, kj::mv(options));
  }

  bool hasJobOwnership() const override { return true; }
  bool refusesOlderIncarnations() const override { return true; }

private:
  EventLoop loop_;
  test::EtcdCluster cluster;
};

struct BackendKind {
  const char* name;
  kj::Own<Backend> (*make)();
};

void PrintTo(const BackendKind& kind, std::ostream* out) { *out << kind.name; }

const BackendKind BACKENDS[] = {
    {"Registry", []() -> kj::Own<Backend> { return kj::heap<RegistryBackend>(true); }},
    {"RegistryOnRealTime", []() -> kj::Own<Backend> { return kj::heap<RegistryBackend>(false); }},
    {"Fixed", []() -> kj::Own<Backend> { return kj::heap<FixedBackend>(); }},
    {"Etcd", []() -> kj::Own<Backend> { return kj::heap<EtcdBackend>(); }},
};

// ---------------------------------------------------------------------------------------------
// The suite

class ResolverConformanceTest : public ::testing::TestWithParam<BackendKind> {
protected:
  ResolverConformanceTest()
      : backend(GetParam().make()),
        loop(backend->loop()),
        publisher(backend->client()),
        observer(backend->client()) {}
  ~ResolverConformanceTest() noexcept override {}

  // `e` registered through `through`, once the resolver accepted it.
  kj::Own<Registration> registered(Resolver& through, Endpoint e) {
    auto registration = through.registerEndpoint(kj::mv(e));
    await(loop, registration->whenRegistered());
    return registration;
  }

  // What registering `e` through `through` is refused with.
  Failure refused(Resolver& through, Endpoint e) {
    auto registration = through.registerEndpoint(kj::mv(e));
    return awaitError(loop, registration->whenRegistered());
  }

  // "name@incarnation address state" for each endpoint `observer` resolves under `prefix`, in
  // the order it gives them.
  Lines entries(kj::StringPtr prefix) {
    Lines out;
    for (auto& e : await(loop, observer->resolve(prefix))) {
      out.push_back(e.name + "@" + std::to_string(e.incarnation) + " " + e.address + " " +
                    toString(e.state).cStr());
    }
    return out;
  }

  // The events of `watch`'s snapshot, its ADDED events up to SYNCED, sorted (the contract leaves
  // their order open).
  Lines snapshot(Watch& watch) {
    Lines added;
    for (;;) {
      auto line = next(loop, watch);
      if (line == "SYNCED") break;
      added.push_back(line);
    }
    std::sort(added.begin(), added.end());
    return added;
  }

  // A watch on `prefix` through `observer`, past its (empty) snapshot.
  kj::Own<Watch> syncedWatch(kj::StringPtr prefix) {
    auto watch = observer->watch(prefix);
    EXPECT_EQ(next(loop, *watch), "SYNCED");
    return watch;
  }

  kj::Own<Backend> backend;
  EventLoop& loop;
  kj::Own<Resolver> publisher;  // registers, as a replica would
  kj::Own<Resolver> observer;   // resolves and watches, as a client would
};

// What calling `fn` is refused with: what it throws, or what the promise it returns rejects
// with (for the calls whose contract says only that they refuse, not how).
template <typename Fn>
Failure refusalOf(EventLoop& loop, Fn&& fn) {
  kj::Maybe<Failure> failure;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto promise = fn();
                failure = awaitError(loop, kj::mv(promise));
              })) {
    return test::failureOf(*e);
  }
  return KJ_ASSERT_NONNULL(failure);
}

TEST_P(ResolverConformanceTest, ARegisteredEndpointIsResolvedByPrefixSortedByName) {
  auto e = endpoint("job-1/ps-1", "tcp://127.0.0.1:4001", 7);
  e.metadata["rank"] = "1";
  auto ps1 = registered(*publisher, e);
  auto ps0 = registered(*publisher, endpoint("job-1/ps-0", "tcp://127.0.0.1:4000"));
  auto worker = registered(*publisher, endpoint("job-1/worker-12", "unix:/tmp/w12.sock", 1,
                                                EndpointState::STARTING));
  auto other = registered(*publisher, endpoint("job-2/ps-0", "tcp://127.0.0.1:5000"));

  auto found = await(loop, observer->resolve("job-1/"));
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].name, "job-1/ps-0");
  EXPECT_EQ(found[1].name, "job-1/ps-1");
  EXPECT_EQ(found[2].name, "job-1/worker-12");
  // The parts of the name are filled in, and what the registrant said is kept.
  EXPECT_EQ(found[1].jobId, "job-1");
  EXPECT_EQ(found[1].actor, "ps");
  EXPECT_EQ(found[1].taskIndex, 1u);
  EXPECT_EQ(found[1].address, "tcp://127.0.0.1:4001");
  EXPECT_EQ(found[1].incarnation, 7u);
  EXPECT_EQ(found[1].state, EndpointState::READY);
  EXPECT_EQ(found[1].metadata, (std::map<std::string, std::string>{{"rank", "1"}}));
  EXPECT_EQ(found[2].actor, "worker");
  EXPECT_EQ(found[2].taskIndex, 12u);
  EXPECT_EQ(found[2].address, "unix:/tmp/w12.sock");
  EXPECT_EQ(found[2].state, EndpointState::STARTING);

  // A prefix is a prefix of the name, not of a path: "job-1/ps-" takes both shards.
  EXPECT_EQ(entries("job-1/ps-"), (Lines{"job-1/ps-0@1 tcp://127.0.0.1:4000 ready",
                                         "job-1/ps-1@7 tcp://127.0.0.1:4001 ready"}));
  EXPECT_EQ(entries("").size(), 4u);
  EXPECT_EQ(entries("job-3/").size(), 0u);
  // The registrant's own client sees the same.
  EXPECT_EQ(await(loop, publisher->resolve("job-2/")).size(), 1u);
}

TEST_P(ResolverConformanceTest, AWatchStartedAfterRegistrationsSeesThemInItsSnapshot) {
  auto a = registered(*publisher, endpoint("job-1/a-0", "tcp://127.0.0.1:4000"));
  auto b = registered(*publisher,
                      endpoint("job-1/b-0", "tcp://127.0.0.1:4001", 1, EndpointState::STARTING));
  auto outside = registered(*publisher, endpoint("job-2/a-0", "tcp://127.0.0.1:4002"));

  auto watch = observer->watch("job-1/");
  auto first = test::nextEvent(loop, *watch);
  ASSERT_EQ(first.type, WatchEvent::Type::ADDED);
  EXPECT_EQ(first.endpoint.jobId, "job-1");
  EXPECT_EQ(first.endpoint.taskIndex, 0u);
  EXPECT_FALSE(first.endpoint.actor.empty());
  auto second = test::describe(test::nextEvent(loop, *watch));
  Lines added{test::describe(first), second};
  std::sort(added.begin(), added.end());
  EXPECT_EQ(added, (Lines{"ADDED job-1/a-0 ready", "ADDED job-1/b-0 starting"}));
  EXPECT_EQ(next(loop, *watch), "SYNCED");

  // Another watch of everything sees all three.
  auto all = observer->watch("");
  EXPECT_EQ(snapshot(*all),
            (Lines{"ADDED job-1/a-0 ready", "ADDED job-1/b-0 starting", "ADDED job-2/a-0 ready"}));
}

TEST_P(ResolverConformanceTest, AWatchReportsRegistrationsStateChangesAndRemovalsAsTheyHappen) {
  auto watch = syncedWatch("job-1/");
  auto e = endpoint("job-1/ps-0", "tcp://127.0.0.1:4000", 3, EndpointState::STARTING);
  e.metadata["rank"] = "0";
  auto registration = registered(*publisher, e);
  auto added = test::nextEvent(loop, *watch);
  EXPECT_EQ(test::describe(added), "ADDED job-1/ps-0 starting");
  EXPECT_EQ(added.endpoint.jobId, "job-1");
  EXPECT_EQ(added.endpoint.actor, "ps");
  EXPECT_EQ(added.endpoint.taskIndex, 0u);
  EXPECT_EQ(added.endpoint.address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(added.endpoint.incarnation, 3u);
  EXPECT_EQ(added.endpoint.metadata.at("rank"), "0");

  registration->setState(EndpointState::READY);
  EXPECT_EQ(next(loop, *watch), "CHANGED job-1/ps-0 ready");
  EXPECT_EQ(entries("job-1/"), (Lines{"job-1/ps-0@3 tcp://127.0.0.1:4000 ready"}));
  registration->setState(EndpointState::DRAINING);
  auto changed = test::nextEvent(loop, *watch);
  EXPECT_EQ(test::describe(changed), "CHANGED job-1/ps-0 draining");
  EXPECT_EQ(changed.endpoint.address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(changed.endpoint.incarnation, 3u);

  auto second = registered(*publisher, endpoint("job-1/ps-1", "tcp://127.0.0.1:4001"));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/ps-1 ready");
  registration = nullptr;
  EXPECT_EQ(next(loop, *watch), "REMOVED job-1/ps-0 draining");
  EXPECT_EQ(entries("job-1/"), (Lines{"job-1/ps-1@1 tcp://127.0.0.1:4001 ready"}));
}

TEST_P(ResolverConformanceTest, DroppingARegistrationRemovesTheEndpointAtOnce) {
  auto registration = registered(*publisher, endpoint("job-1/ps-0"));
  auto watch = observer->watch("");
  EXPECT_EQ(snapshot(*watch), (Lines{"ADDED job-1/ps-0 ready"}));
  registration = nullptr;
  // Before any lease could lapse: the backend's leases outlast the test.
  EXPECT_EQ(next(loop, *watch), "REMOVED job-1/ps-0 ready");
  EXPECT_EQ(entries("").size(), 0u);
  EXPECT_EQ(await(loop, publisher->resolve("")).size(), 0u);
}

TEST_P(ResolverConformanceTest, ANewerIncarnationReplacesTheEntryAndOutlivesTheOlderHolder) {
  auto older = registered(*publisher, endpoint("job-1/ps-0", "tcp://127.0.0.1:4000", 1));
  auto watch = observer->watch("job-1/");
  EXPECT_EQ(snapshot(*watch), (Lines{"ADDED job-1/ps-0 ready"}));

  // A restarted replica, through a client of its own.
  auto restarted = backend->client();
  auto newer = registered(*restarted, endpoint("job-1/ps-0", "tcp://127.0.0.1:5000", 2));
  auto changed = test::nextEvent(loop, *watch);
  EXPECT_EQ(test::describe(changed), "CHANGED job-1/ps-0 ready");
  EXPECT_EQ(changed.endpoint.address, "tcp://127.0.0.1:5000");
  EXPECT_EQ(changed.endpoint.incarnation, 2u);
  EXPECT_EQ(entries("job-1/"), (Lines{"job-1/ps-0@2 tcp://127.0.0.1:5000 ready"}));

  // The old holder goes late (its process was cut off, say): the newer entry stays. What the
  // old holder's client does next shows up after whatever its drop did.
  older = nullptr;
  auto marker = registered(*publisher, endpoint("job-1/marker-0"));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/marker-0 ready");
  EXPECT_EQ(entries("job-1/ps-"), (Lines{"job-1/ps-0@2 tcp://127.0.0.1:5000 ready"}));

  // The newer holder's drop does remove it.
  newer = nullptr;
  EXPECT_EQ(next(loop, *watch), "REMOVED job-1/ps-0 ready");
}

TEST_P(ResolverConformanceTest, TheSameOrAnOlderIncarnationIsRefusedWhileTheHolderLives) {
  if (!backend->refusesOlderIncarnations()) {
    GTEST_SKIP() << "a registration here takes a name over whatever its incarnation";
  }
  auto holder = registered(*publisher, endpoint("job-1/ps-0", "tcp://127.0.0.1:4000", 5));
  auto watch = observer->watch("job-1/");
  EXPECT_EQ(snapshot(*watch), (Lines{"ADDED job-1/ps-0 ready"}));
  auto twin = backend->client();
  for (uint64_t incarnation : {5, 4}) {
    auto failure = refused(*twin, endpoint("job-1/ps-0", "tcp://127.0.0.1:6000", incarnation));
    EXPECT_EQ(failure.code, ErrorCode::NAME_TAKEN) << incarnation << ": " << failure.text;
  }
  EXPECT_EQ(entries("job-1/"), (Lines{"job-1/ps-0@5 tcp://127.0.0.1:4000 ready"}));
  // Nothing was reported for the refusals.
  auto marker = registered(*twin, endpoint("job-1/marker-0"));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/marker-0 ready");
}

TEST_P(ResolverConformanceTest, EndingAJobRemovesItsEndpointsAndRefusesItsRegistrations) {
  auto a = registered(*publisher, endpoint("job-1/a-0", "tcp://127.0.0.1:4000"));
  auto b = registered(*publisher, endpoint("job-1/b-0", "tcp://127.0.0.1:4001"));
  auto bystander = registered(*publisher, endpoint("job-2/a-0", "tcp://127.0.0.1:4002"));
  auto watch = observer->watch("job-1/");
  EXPECT_EQ(snapshot(*watch).size(), 2u);
  auto everything = observer->watch("");
  EXPECT_EQ(snapshot(*everything).size(), 3u);
  auto otherJob = observer->watch("job-2/");
  EXPECT_EQ(snapshot(*otherJob).size(), 1u);

  await(loop, backend->client()->setJobStatus({"job-1", JobState::ENDED, "done"}));
  // REMOVED for each of its endpoints (in any order), then JOB_ENDED, on every watch the job
  // overlaps.
  for (auto* w : {watch.get(), everything.get()}) {
    Lines removed{next(loop, *w), next(loop, *w)};
    std::sort(removed.begin(), removed.end());
    EXPECT_EQ(removed, (Lines{"REMOVED job-1/a-0 ready", "REMOVED job-1/b-0 ready"}));
    auto ended = test::nextEvent(loop, *w);
    EXPECT_EQ(test::describe(ended), "JOB_ENDED job-1 done");
    EXPECT_EQ(ended.job, (JobStatus{"job-1", JobState::ENDED, "done"}));
  }
  EXPECT_EQ(await(loop, observer->jobStatus("job-1")),
            (JobStatus{"job-1", JobState::ENDED, "done"}));
  EXPECT_EQ(await(loop, observer->jobStatus("job-2")).state, JobState::RUNNING);
  EXPECT_EQ(entries(""), (Lines{"job-2/a-0@1 tcp://127.0.0.1:4002 ready"}));

  // Its replicas cannot come back while it is ended, new or old, through any client.
  auto failure = refused(*publisher, endpoint("job-1/a-1"));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ENDED) << failure.text;
  failure = refused(*backend->client(), endpoint("job-1/a-0", "tcp://127.0.0.1:4000", 2));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ENDED) << failure.text;
  a = nullptr;  // their entries are gone already: nothing to report
  b = nullptr;

  // The other job's watch saw none of it.
  auto marker = registered(*publisher, endpoint("job-2/marker-0"));
  EXPECT_EQ(next(loop, *otherJob), "ADDED job-2/marker-0 ready");

  // Running again, the job's replicas register anew.
  await(loop, publisher->setJobStatus({"job-1", JobState::RUNNING, ""}));
  EXPECT_EQ(await(loop, observer->jobStatus("job-1")).state, JobState::RUNNING);
  auto again = registered(*publisher, endpoint("job-1/a-0", "tcp://127.0.0.1:4010", 3));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/a-0 ready");
  EXPECT_EQ(entries("job-1/"), (Lines{"job-1/a-0@3 tcp://127.0.0.1:4010 ready"}));
}

TEST_P(ResolverConformanceTest, AJobNobodyMentionedIsRunning) {
  EXPECT_EQ(await(loop, observer->jobStatus("job-9")), (JobStatus{"job-9", JobState::RUNNING, ""}));
  auto registration = registered(*publisher, endpoint("job-9/a-0"));
  EXPECT_EQ(await(loop, observer->jobStatus("job-9")), (JobStatus{"job-9", JobState::RUNNING, ""}));
}

TEST_P(ResolverConformanceTest, ALongReasonIsCut) {
  await(loop, publisher->setJobStatus(
                  {"job-9", JobState::ENDED, std::string(MAX_JOB_REASON_BYTES * 2, 'x')}));
  auto status = await(loop, observer->jobStatus("job-9"));
  EXPECT_EQ(status.state, JobState::ENDED);
  EXPECT_LE(status.reason.size(), MAX_JOB_REASON_BYTES);
  EXPECT_EQ(status.reason.substr(status.reason.size() - 3), "...");
  EXPECT_EQ(status.reason.substr(0, 10), "xxxxxxxxxx");
}

TEST_P(ResolverConformanceTest, BadNamesAndPrefixesAreInvalidArgument) {
  auto watch = syncedWatch("");
  for (const char* name : {"no-slash", "job 1/ps-0", "job-1/ps", "job-1/ps-x", "job-1/ps-01",
                           "/ps-0", "job-1/-0", ""}) {
    auto failure = refused(*publisher, endpoint(name));
    EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT) << "'" << name << "': " << failure.text;
  }
  // None was published.
  auto marker = registered(*publisher, endpoint("job-1/marker-0"));
  EXPECT_EQ(next(loop, *watch), "ADDED job-1/marker-0 ready");
  EXPECT_EQ(entries("").size(), 1u);

  std::string tooLong(MAX_PREFIX_LENGTH + 1, 'a');
  EXPECT_EQ(await(loop, observer->resolve(std::string(MAX_PREFIX_LENGTH, 'a'))).size(), 0u);
  for (std::string prefix : {std::string("a b"), std::string("job-1/\n"), std::string("j\tob"),
                             std::string("caf\xc3\xa9"), tooLong}) {
    auto thrown = test::thrownBy([&]() { observer->resolve(prefix); });
    EXPECT_EQ(thrown.code, ErrorCode::INVALID_ARGUMENT) << printable(prefix).cStr();
    kj::Own<Watch> refusedWatch;
    auto watched = refusalOf(loop, [&]() {
      refusedWatch = observer->watch(prefix);
      return refusedWatch->next();
    });
    EXPECT_EQ(watched.code, ErrorCode::INVALID_ARGUMENT) << printable(prefix).cStr();
  }

  auto status = refusalOf(loop, [&]() { return observer->jobStatus("bad job"); });
  EXPECT_EQ(status.code, ErrorCode::INVALID_ARGUMENT) << status.text;
  for (const char* job : {"", "bad job", "job/1"}) {
    auto thrown = test::thrownBy([&]() { publisher->setJobStatus({job, JobState::ENDED, "no"}); });
    EXPECT_EQ(thrown.code, ErrorCode::INVALID_ARGUMENT) << "'" << job << "': " << thrown.text;
  }
}

TEST_P(ResolverConformanceTest, ACreatedJobHasOneOwnerUntilItEnds) {
  auto launcher = backend->client();
  auto credential = await(loop, launcher->createJob("calc"));
  EXPECT_FALSE(credential.empty());
  EXPECT_LE(credential.size(), MAX_JOB_CREDENTIAL_BYTES);
  EXPECT_EQ(await(loop, observer->jobStatus("calc")).state, JobState::RUNNING);

  // A second launcher, anywhere, cannot create it while it is live.
  auto failure = awaitError(loop, backend->client()->createJob("calc"));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ALREADY_EXISTS) << failure.text;
  failure = awaitError(loop, launcher->createJob("calc"));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ALREADY_EXISTS) << failure.text;

  // Its state is the owner's to set.
  failure = awaitError(loop, observer->setJobStatus({"calc", JobState::ENDED, "mischief"}));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED) << failure.text;
  failure = awaitError(loop, observer->setJobStatus({"calc", JobState::ENDED, "mischief"},
                                                    std::string(64, 'a')));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED) << failure.text;
  EXPECT_EQ(await(loop, observer->jobStatus("calc")).state, JobState::RUNNING);

  // Once its owner ended it, the name may be created again, with a new credential.
  await(loop, observer->setJobStatus({"calc", JobState::ENDED, "done"}, credential));
  EXPECT_EQ(await(loop, observer->jobStatus("calc")), (JobStatus{"calc", JobState::ENDED, "done"}));
  auto again = await(loop, backend->client()->createJob("calc"));
  EXPECT_NE(again, credential);
  EXPECT_EQ(await(loop, observer->jobStatus("calc")).state, JobState::RUNNING);
}

TEST_P(ResolverConformanceTest, JobsListsEveryJobWithItsLauncherAndReadyReplicas) {
  auto wallNow = []() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  auto before = wallNow();
  auto launcher = backend->client();
  auto credential = await(loop, launcher->createJob("calc", {"local", 3}));
  auto replica = backend->client("calc", credential);
  auto calc0 = registered(*replica, endpoint("calc/calc-0", "tcp://127.0.0.1:4000"));
  // A second actor of the same replica: still one replica ready.
  auto stats0 = registered(*replica, endpoint("calc/stats-0", "tcp://127.0.0.1:4000"));
  auto calc1 = registered(*replica, endpoint("calc/calc-1", "tcp://127.0.0.1:4001", 1,
                                             EndpointState::STARTING));
  auto open = registered(*publisher, endpoint("open/x-0"));
  auto done = await(loop, launcher->createJob("done", {std::string(100, 'k'), 2}));
  await(loop, launcher->setJobStatus({"done", JobState::ENDED, "completed"}, done));
  auto after = wallNow();

  auto jobs = await(loop, observer->jobs());
  ASSERT_EQ(jobs.size(), 3u);
  auto& calc = jobs[0];
  EXPECT_EQ(calc.status, (JobStatus{"calc", JobState::RUNNING, ""}));
  EXPECT_EQ(calc.launcher, "local");
  EXPECT_EQ(calc.replicas, 3u);
  EXPECT_EQ(calc.ready, 1u);
  EXPECT_EQ(calc.endpoints, 3u);
  EXPECT_GE(calc.createdAtMillis, before - 1000);
  EXPECT_LE(calc.createdAtMillis, after + 1000);
  EXPECT_EQ(calc.endedAtMillis, 0);

  auto& ended = jobs[1];
  EXPECT_EQ(ended.status, (JobStatus{"done", JobState::ENDED, "completed"}));
  EXPECT_EQ(ended.launcher, std::string(MAX_LAUNCHER_KIND_BYTES, 'k'));
  EXPECT_EQ(ended.replicas, 2u);
  EXPECT_EQ(ended.ready, 0u);
  EXPECT_GE(ended.endedAtMillis, ended.createdAtMillis);
  EXPECT_LE(ended.endedAtMillis, after + 1000);

  // A job no launcher created: known by its endpoints, since its first registration.
  auto& opened = jobs[2];
  EXPECT_EQ(opened.status, (JobStatus{"open", JobState::RUNNING, ""}));
  EXPECT_EQ(opened.launcher, "");
  EXPECT_EQ(opened.replicas, 0u);
  EXPECT_EQ(opened.ready, 1u);
  EXPECT_EQ(opened.endpoints, 1u);

  // A replica going ready shows at once.
  calc1->setState(EndpointState::READY);
  auto marker = registered(*replica, endpoint("calc/marker-0"));
  EXPECT_EQ(await(loop, observer->jobs())[0].ready, 2u);
}

TEST_P(ResolverConformanceTest, ARegistrationUnderACreatedJobNeedsItsCredential) {
  if (!backend->hasJobOwnership()) {
    GTEST_SKIP() << "registrations here are the process's own and need no credential";
  }
  auto credential = await(loop, backend->client()->createJob("calc"));
  auto replica = backend->client("calc", credential);
  auto mine = registered(*replica, endpoint("calc/calc-0", "tcp://127.0.0.1:4000", 10));

  auto failure = refused(*publisher, endpoint("calc/calc-1"));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED) << failure.text;
  failure = refused(*backend->client("calc", std::string(64, 'a')), endpoint("calc/calc-2"));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED) << failure.text;
  // Not even a newer incarnation of a replica's name.
  failure = refused(*publisher, endpoint("calc/calc-0", "tcp://127.0.0.1:6666", 99));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED) << failure.text;
  // A credential is for its own job only.
  failure = refused(*backend->client("other", credential), endpoint("calc/calc-3"));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED) << failure.text;

  EXPECT_EQ(entries("calc/"), (Lines{"calc/calc-0@10 tcp://127.0.0.1:4000 ready"}));
  // Jobs nobody created stay open to all.
  auto open = registered(*publisher, endpoint("open/x-0"));
  EXPECT_EQ(entries("open/").size(), 1u);
}

TEST_P(ResolverConformanceTest, WatchesOfTwoPrefixesEachSeeOnlyTheirOwnEndpoints) {
  auto one = syncedWatch("job-1/");
  auto ten = syncedWatch("job-10/");
  auto shards = syncedWatch("job-1/ps-");
  // Registered in this order through one client, so reported in this order.
  kj::Vector<kj::Own<Registration>> held;
  for (const char* name :
       {"job-1/ps-0", "job-10/ps-0", "job-1/worker-0", "job-10/ps-1", "job-1/ps-1", "job-2/ps-0"}) {
    held.add(registered(*publisher, endpoint(name)));
  }
  held.add(registered(*publisher, endpoint("job-1/last-0")));
  held.add(registered(*publisher, endpoint("job-10/last-0")));
  EXPECT_EQ(next(loop, *one), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(next(loop, *one), "ADDED job-1/worker-0 ready");
  EXPECT_EQ(next(loop, *one), "ADDED job-1/ps-1 ready");
  EXPECT_EQ(next(loop, *one), "ADDED job-1/last-0 ready");
  EXPECT_EQ(next(loop, *ten), "ADDED job-10/ps-0 ready");
  EXPECT_EQ(next(loop, *ten), "ADDED job-10/ps-1 ready");
  EXPECT_EQ(next(loop, *ten), "ADDED job-10/last-0 ready");
  EXPECT_EQ(next(loop, *shards), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(next(loop, *shards), "ADDED job-1/ps-1 ready");

  // Removals too.
  held.clear();
  Lines removed;
  for (int i = 0; i < 3; ++i) removed.push_back(next(loop, *ten));
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (Lines{"REMOVED job-10/last-0 ready", "REMOVED job-10/ps-0 ready",
                            "REMOVED job-10/ps-1 ready"}));
  auto marker = registered(*publisher, endpoint("job-10/marker-0"));
  EXPECT_EQ(next(loop, *ten), "ADDED job-10/marker-0 ready");
}

std::string backendName(const ::testing::TestParamInfo<BackendKind>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Resolvers, ResolverConformanceTest, ::testing::ValuesIn(BACKENDS),
                         backendName);

}  // namespace
}  // namespace troupe
