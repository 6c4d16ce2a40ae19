// RegistryServer through its raw Cap'n Proto interface (schemas/registry.capnp): leases and their
// lifetimes, watches, incarnations, job states and bad input. The registry runs in-process;
// clients reach it through capability() or over real sockets on port 0.

#include "troupe/resolver/registry_server.h"

#include <sys/stat.h>

#include <set>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/net/channel.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/resident_memory.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::endpoint;
using test::nextRecorded;
using test::RecordingWatcher;

using RegisterResponse = capnp::Response<schema::Registry::RegisterResults>;

// On a manual clock: leases expire when the test moves time past their TTL.
class RegistryServerTest : public ::testing::Test {
protected:
  RegistryServerTest()
      : loop(EventLoopOptions{.manualClock = true}),
        server(kj::heap<RegistryServer>(loop, options())) {}
  ~RegistryServerTest() noexcept override {}

  virtual RegistryServerOptions options() { return {}; }

  schema::Registry::Client registry() { return server->capability(); }

  // `target`, or the in-process capability.
  schema::Registry::Client pick(kj::Maybe<schema::Registry::Client>& target) {
    KJ_IF_MAYBE(t, target) {
      return *t;
    }
    return registry();
  }

  kj::Promise<RegisterResponse> registerRequest(schema::Registry::Client target, const Endpoint& e,
                                                uint32_t ttlMillis = 0) {
    auto request = target.registerRequest();
    e.toCapnp(request.initEndpoint());
    request.setTtlMillis(ttlMillis);
    return request.send();
  }

  // Registers `e` and returns its lease (the response holding another reference is dropped).
  schema::Lease::Client add(const Endpoint& e, uint32_t ttlMillis = 0,
                            kj::Maybe<schema::Registry::Client> target = nullptr) {
    auto response = await(loop, registerRequest(pick(target), e, ttlMillis));
    return response.getLease();
  }

  test::Failure refusal(const Endpoint& e, uint32_t ttlMillis = 0) {
    return awaitError(loop, registerRequest(registry(), e, ttlMillis));
  }

  kj::Array<Endpoint> resolve(kj::StringPtr prefix,
                              kj::Maybe<schema::Registry::Client> target = nullptr) {
    auto request = pick(target).resolveRequest();
    request.setPrefix(prefix);
    auto response = await<capnp::Response<schema::Registry::ResolveResults>>(loop, request.send());
    return KJ_MAP(e, response.getEndpoints()) { return Endpoint::fromCapnp(e); };
  }

  schema::WatchHandle::Client watch(kj::StringPtr prefix, RecordingWatcher::State& state) {
    auto request = registry().watchRequest();
    request.setPrefix(prefix);
    request.setWatcher(kj::heap<RecordingWatcher>(state));
    return await<capnp::Response<schema::Registry::WatchResults>>(loop, request.send()).getHandle();
  }

  uint32_t renew(schema::Lease::Client& lease) {
    return await<capnp::Response<schema::Lease::RenewResults>>(loop, lease.renewRequest().send())
        .getTtlMillis();
  }

  kj::Promise<void> setState(schema::Lease::Client& lease, EndpointState state) {
    auto request = lease.setStateRequest();
    request.setState(toCapnp(state));
    return request.send().then([](auto&&) {});
  }

  kj::Promise<void> setJobStatus(JobStatus status) {
    auto request = registry().setJobStatusRequest();
    toCapnp(status, request.initStatus());
    return request.send().then([](auto&&) {});
  }

  JobStatus jobStatus(kj::StringPtr jobId) {
    auto request = registry().jobStatusRequest();
    request.setJobId(jobId);
    auto response = await<capnp::Response<schema::Registry::JobStatusResults>>(loop,
                                                                               request.send());
    return fromCapnp(response.getStatus());
  }

  // Runs the loop until `done()` holds; false if it never does within a few thousand turns
  // (in-process calls and loopback I/O settle within a handful).
  template <typename Fn>
  bool settle(Fn&& done) {
    for (int i = 0; i < 2000; ++i) {
      if (done()) return true;
      loop.waitScope().poll();
    }
    return done();
  }

  // What the recording watchers saw. Declared before the loop: watchers may live until the loop
  // goes.
  RecordingWatcher::State& newState() {
    states.add(kj::heap<RecordingWatcher::State>());
    return *states.back();
  }
  kj::Vector<kj::Own<RecordingWatcher::State>> states;

  EventLoop loop;
  kj::Own<RegistryServer> server;
};

kj::String names(kj::ArrayPtr<const Endpoint> endpoints) {
  kj::Vector<kj::String> out;
  for (auto& e : endpoints) out.add(kj::str(e.name.c_str()));
  return kj::strArray(out, ",");
}

// ---------------------------------------------------------------------------------------------

TEST_F(RegistryServerTest, RegisterThenResolveByPrefixSortedWithNamePartsFilledIn) {
  auto e = endpoint("job-1/ps-1", "127.0.0.1:4001", 7);
  e.jobId = "wrong";
  e.actor = "wrong";
  e.taskIndex = 99;
  e.metadata["gpu"] = "a100";
  auto l1 = add(e);
  auto l2 = add(endpoint("job-1/ps-0"));
  auto l3 = add(endpoint("job-2/worker-3"));
  EXPECT_EQ(server->endpointCount(), 3u);

  auto found = resolve("job-1/");
  ASSERT_EQ(names(found), "job-1/ps-0,job-1/ps-1");
  EXPECT_EQ(found[1].jobId, "job-1");
  EXPECT_EQ(found[1].actor, "ps");
  EXPECT_EQ(found[1].taskIndex, 1u);
  EXPECT_EQ(found[1].address, "tcp://127.0.0.1:4001");  // canonical form
  EXPECT_EQ(found[1].incarnation, 7u);
  EXPECT_EQ(found[1].state, EndpointState::READY);
  EXPECT_EQ(found[1].metadata.at("gpu"), "a100");
  EXPECT_EQ(names(resolve("")), "job-1/ps-0,job-1/ps-1,job-2/worker-3");
  EXPECT_EQ(names(resolve("job-2/w")), "job-2/worker-3");
  EXPECT_EQ(resolve("job-3/").size(), 0u);
}

TEST_F(RegistryServerTest, AWatchGetsTheSnapshotThenSyncedThenLiveChanges) {
  auto a = add(endpoint("job-1/a-0"));
  auto b = add(endpoint("job-1/b-0", "tcp://127.0.0.1:4000", 1, EndpointState::STARTING));
  auto other = add(endpoint("job-2/a-0"));
  auto& state = newState();
  auto handle = watch("job-1/", state);
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job-1/a-0 ready");
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job-1/b-0 starting");
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");

  auto c = add(endpoint("job-1/c-0"));
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job-1/c-0 ready");
  await(loop, setState(b, EndpointState::READY));
  EXPECT_EQ(nextRecorded(loop, state), "CHANGED job-1/b-0 ready");
  await(loop, setState(b, EndpointState::READY));  // no change, no event
  auto other2 = add(endpoint("job-2/b-0"));        // outside the prefix
  a = nullptr;
  EXPECT_EQ(nextRecorded(loop, state), "REMOVED job-1/a-0 ready");
  EXPECT_EQ(server->watcherCount(), 1u);
}

TEST_F(RegistryServerTest, ReleasingTheLeaseRemovesTheEntryAtOnce) {
  auto lease = add(endpoint("job-1/ps-0"), 60000);
  auto& state = newState();
  auto handle = watch("", state);
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job-1/ps-0 ready");
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");
  lease = nullptr;
  EXPECT_EQ(nextRecorded(loop, state), "REMOVED job-1/ps-0 ready");
  EXPECT_EQ(server->endpointCount(), 0u);
}

TEST_F(RegistryServerTest, ALostConnectionRemovesItsEntriesAtOnceEvenWithTheLeaseStillHeld) {
  auto address = server->listen("tcp://127.0.0.1:0");
  auto channel = Channel::open(loop, address.c_str());
  auto remote = channel->bootstrap<schema::Registry>();
  auto lease1 = add(endpoint("job-1/ps-0"), 60000, remote);
  auto lease2 = add(endpoint("job-1/ps-1"), 60000, remote);
  EXPECT_EQ(server->connectionCount(), 1u);
  auto& state = newState();
  auto handle = watch("", state);
  nextRecorded(loop, state);
  nextRecorded(loop, state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");

  channel->disconnect();  // the registrant's connection goes; its lease capabilities stay
  std::set<std::string> removed{nextRecorded(loop, state), nextRecorded(loop, state)};
  EXPECT_EQ(removed,
            (std::set<std::string>{"REMOVED job-1/ps-0 ready", "REMOVED job-1/ps-1 ready"}));
  EXPECT_EQ(server->endpointCount(), 0u);
}

TEST_F(RegistryServerTest, ALeaseThatIsNeverRenewedExpiresAfterItsTtl) {
  auto lease = add(endpoint("job-1/ps-0"), 150);
  auto& state = newState();
  auto handle = watch("", state);
  nextRecorded(loop, state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");
  // Nothing renews it: the registry removes it once the TTL has passed, and not before.
  loop.advanceTime(150 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(settle([&]() { return !state.events.empty(); })) << state.events.front();
  EXPECT_EQ(server->endpointCount(), 1u);
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(settle([&]() { return !state.events.empty(); })) << "the lease did not expire";
  EXPECT_EQ(nextRecorded(loop, state), "REMOVED job-1/ps-0 ready");
  EXPECT_EQ(server->endpointCount(), 0u);
  // The holder learns on its next call.
  auto e = awaitError(loop, lease.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::LEASE_LOST) << e.text;
  e = awaitError(loop, setState(lease, EndpointState::DRAINING));
  EXPECT_EQ(e.code, ErrorCode::LEASE_LOST) << e.text;
}

TEST_F(RegistryServerTest, ARenewedLeaseLivesOneTtlFromItsLastRenewal) {
  auto lease = add(endpoint("job-1/ps-0"), 1000);
  auto& state = newState();
  auto handle = watch("", state);
  nextRecorded(loop, state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");
  loop.advanceTime(900 * kj::MILLISECONDS);
  EXPECT_EQ(renew(lease), 1000u);
  // Past the first TTL, short of a TTL since the renewal.
  loop.advanceTime(1000 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(settle([&]() { return !state.events.empty(); })) << state.events.front();
  EXPECT_EQ(server->endpointCount(), 1u);
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(settle([&]() { return !state.events.empty(); })) << "the lease did not expire";
  EXPECT_EQ(nextRecorded(loop, state), "REMOVED job-1/ps-0 ready");
  auto e = awaitError(loop, lease.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::LEASE_LOST) << e.text;
}

TEST_F(RegistryServerTest, RenewReturnsTheGrantedTtlClampedToTheRegistrysBounds) {
  auto byDefault = add(endpoint("job-1/a-0"), 0);
  EXPECT_EQ(renew(byDefault), 10000u);
  auto tooShort = add(endpoint("job-1/b-0"), 1);
  EXPECT_EQ(renew(tooShort), 100u);
  auto tooLong = add(endpoint("job-1/c-0"), 24 * 3600 * 1000);
  EXPECT_EQ(renew(tooLong), 300000u);
  auto asked = add(endpoint("job-1/d-0"), 2500);
  EXPECT_EQ(renew(asked), 2500u);
  EXPECT_EQ(server->endpointCount(), 4u);
}

TEST_F(RegistryServerTest, ASecondHolderWithTheSameOrAnOlderIncarnationIsRefusedNameTaken) {
  auto lease = add(endpoint("job-1/ps-0", "tcp://127.0.0.1:4000", 5));
  for (uint64_t incarnation : {5, 4, 0}) {
    auto e = refusal(endpoint("job-1/ps-0", "tcp://127.0.0.1:5000", incarnation));
    EXPECT_EQ(e.code, ErrorCode::NAME_TAKEN) << e.text;
    EXPECT_TRUE(e.mentions("incarnation 5")) << e.text;
  }
  auto found = resolve("");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(renew(lease), 10000u);  // the holder is unaffected
}

TEST_F(RegistryServerTest, ANewerIncarnationReplacesTheEntryAndRevokesTheOldLease) {
  auto old = add(endpoint("job-1/ps-0", "tcp://127.0.0.1:4000", 1));
  auto& state = newState();
  auto handle = watch("job-1/", state);
  nextRecorded(loop, state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");

  auto fresh = add(endpoint("job-1/ps-0", "tcp://127.0.0.1:5000", 2));
  EXPECT_EQ(nextRecorded(loop, state), "CHANGED job-1/ps-0 ready");
  auto found = resolve("");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].incarnation, 2u);
  EXPECT_EQ(found[0].address, "tcp://127.0.0.1:5000");

  auto e = awaitError(loop, old.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::LEASE_LOST) << e.text;
  e = awaitError(loop, setState(old, EndpointState::DRAINING));
  EXPECT_EQ(e.code, ErrorCode::LEASE_LOST) << e.text;

  // Releasing the revoked lease leaves the new entry alone.
  old = nullptr;
  await(loop, setState(fresh, EndpointState::DRAINING));
  EXPECT_EQ(nextRecorded(loop, state), "CHANGED job-1/ps-0 draining");  // not REMOVED
  EXPECT_EQ(server->endpointCount(), 1u);
  EXPECT_EQ(renew(fresh), 10000u);
  fresh = nullptr;
  EXPECT_EQ(nextRecorded(loop, state), "REMOVED job-1/ps-0 draining");
}

TEST_F(RegistryServerTest, EndingAJobRemovesItsEndpointsRefusesThemAndRunningAgainAllowsThem) {
  auto a = add(endpoint("job-1/a-0"));
  auto b = add(endpoint("job-1/b-0"));
  auto other = add(endpoint("job-10/a-0"));
  auto& job1 = newState();
  auto& everything = newState();
  auto& job10 = newState();
  auto h1 = watch("job-1/", job1);
  auto h2 = watch("job", everything);
  auto h3 = watch("job-10/", job10);
  EXPECT_EQ(nextRecorded(loop, job1), "ADDED job-1/a-0 ready");
  EXPECT_EQ(nextRecorded(loop, job1), "ADDED job-1/b-0 ready");
  EXPECT_EQ(nextRecorded(loop, job1), "SYNCED");
  for (int i = 0; i < 4; ++i) nextRecorded(loop, everything);
  EXPECT_EQ(nextRecorded(loop, job10), "ADDED job-10/a-0 ready");
  EXPECT_EQ(nextRecorded(loop, job10), "SYNCED");

  EXPECT_EQ(jobStatus("job-1"), (JobStatus{"job-1", JobState::RUNNING, ""}));
  await(loop, setJobStatus({"job-1", JobState::ENDED, "completed"}));
  EXPECT_EQ(nextRecorded(loop, job1), "REMOVED job-1/a-0 ready");
  EXPECT_EQ(nextRecorded(loop, job1), "REMOVED job-1/b-0 ready");
  EXPECT_EQ(nextRecorded(loop, job1), "JOB_ENDED job-1 completed");
  EXPECT_EQ(nextRecorded(loop, everything), "REMOVED job-1/a-0 ready");
  EXPECT_EQ(nextRecorded(loop, everything), "REMOVED job-1/b-0 ready");
  EXPECT_EQ(nextRecorded(loop, everything), "JOB_ENDED job-1 completed");
  EXPECT_EQ(jobStatus("job-1"), (JobStatus{"job-1", JobState::ENDED, "completed"}));
  EXPECT_EQ(names(resolve("")), "job-10/a-0");

  // The job's leases are gone and its endpoints are refused.
  auto e = awaitError(loop, a.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::LEASE_LOST) << e.text;
  e = refusal(endpoint("job-1/a-0", "tcp://127.0.0.1:4000", 2));
  EXPECT_EQ(e.code, ErrorCode::JOB_ENDED) << e.text;
  EXPECT_TRUE(e.mentions("completed")) << e.text;

  // job-10 was untouched: its watcher's next event is the next change under it.
  auto z = add(endpoint("job-10/z-0"));
  EXPECT_EQ(nextRecorded(loop, job10), "ADDED job-10/z-0 ready");

  await(loop, setJobStatus({"job-1", JobState::RUNNING, ""}));
  EXPECT_EQ(jobStatus("job-1").state, JobState::RUNNING);
  auto again = add(endpoint("job-1/a-0", "tcp://127.0.0.1:4000", 2));
  EXPECT_EQ(nextRecorded(loop, job1), "ADDED job-1/a-0 ready");
}

TEST_F(RegistryServerTest, BadInputIsRefusedWithInvalidArgumentAndTheRegistryKeepsServing) {
  auto address = server->listen("tcp://127.0.0.1:0");
  auto channel = Channel::open(loop, address.c_str());
  auto remote = channel->bootstrap<schema::Registry>();
  auto refused = [&](const Endpoint& e) { return awaitError(loop, registerRequest(remote, e)); };

  for (auto name : {"", "nojob", "job/ps", "job/ps-x", "job/-1", "../x-1", "job/ps-1/x",
                    "job/p s-1", "job\x01/ps-1"}) {
    auto e = refused(endpoint(name));
    EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << name << ": " << e.text;
  }
  auto e = refused(endpoint(std::string(300, 'j') + "/ps-0"));
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  e = refused(endpoint("job/ps-0", "nonsense://x"));
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  EXPECT_TRUE(e.mentions("address")) << e.text;

  auto big = endpoint("job/ps-0");
  big.metadata["blob"] = std::string(70 * 1024, 'x');
  e = refused(big);
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  EXPECT_TRUE(e.mentions("limit is 65536")) << e.text;

  for (auto prefix : {"job 1", "job\n", "job\x7f", "caf\xc3\xa9"}) {
    auto request = remote.resolveRequest();
    request.setPrefix(prefix);
    e = awaitError(loop, request.send());
    EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
    auto watchRequest = remote.watchRequest();
    watchRequest.setPrefix(prefix);
    auto& state = newState();
    watchRequest.setWatcher(kj::heap<RecordingWatcher>(state));
    e = awaitError(loop, watchRequest.send());
    EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  }
  auto longPrefix = std::string(MAX_PREFIX_LENGTH + 1, 'a');
  auto request = remote.resolveRequest();
  request.setPrefix(longPrefix);
  e = awaitError(loop, request.send());
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;

  auto jobRequest = remote.jobStatusRequest();
  jobRequest.setJobId("bad job");
  e = awaitError(loop, jobRequest.send());
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  auto setRequest = remote.setJobStatusRequest();
  setRequest.initStatus().setJobId("");
  e = awaitError(loop, setRequest.send());
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;

  // Still serving, on the same connection.
  EXPECT_EQ(server->endpointCount(), 0u);
  auto lease = add(endpoint("job/ps-0"), 0, remote);
  EXPECT_EQ(names(resolve("", remote)), "job/ps-0");
  EXPECT_EQ(channel->epoch(), 1u);
}

TEST_F(RegistryServerTest, GarbageOnTheSocketClosesOnlyThatConnection) {
  auto address = server->listen("tcp://127.0.0.1:0");
  auto channel = Channel::open(loop, address.c_str());
  auto remote = channel->bootstrap<schema::Registry>();
  auto lease = add(endpoint("job/ps-0"), 60000, remote);

  auto parsed = Address::parse(address.c_str());
  auto raw = await(
      loop,
      loop.network().parseAddress(parsed.toKjAddress()).then([](kj::Own<kj::NetworkAddress> a) {
        return a->connect().attach(kj::mv(a));
      }));
  kj::byte garbage[64];
  memset(garbage, 0xff, sizeof(garbage));
  await(loop, raw->write(garbage, sizeof(garbage)));
  auto rest = await(loop, raw->readAllBytes());  // the registry hangs up on it
  EXPECT_LT(rest.size(), 4096u);

  EXPECT_EQ(names(resolve("", remote)), "job/ps-0");
  EXPECT_EQ(renew(lease), 60000u);
  EXPECT_TRUE(settle([&]() { return server->connectionCount() == 1; }));
}

TEST_F(RegistryServerTest, ASlowWatcherGetsLaterEventsAsOneBatch) {
  auto& state = newState();
  state.hold = true;
  auto handle = watch("", state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");  // first batch, held open
  auto a = add(endpoint("job/a-0"));
  auto b = add(endpoint("job/b-0"));
  auto c = add(endpoint("job/c-0"));
  EXPECT_EQ(state.batchSizes.size(), 1u);  // nothing more sent while the first call is pending
  state.release();
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job/a-0 ready");
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job/b-0 ready");
  EXPECT_EQ(nextRecorded(loop, state), "ADDED job/c-0 ready");
  ASSERT_EQ(state.batchSizes.size(), 2u);
  EXPECT_EQ(state.batchSizes[1], 3u);
}

TEST_F(RegistryServerTest, AWatcherWhoseCallFailsIsDroppedAndReleased) {
  auto& state = newState();
  auto handle = watch("", state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");
  state.failNext = true;
  auto a = add(endpoint("job/a-0"));
  EXPECT_EQ(nextRecorded(loop, state), "(released)");
  EXPECT_EQ(server->watcherCount(), 0u);
  auto b = add(endpoint("job/b-0"));  // the registry carries on
  EXPECT_EQ(server->endpointCount(), 2u);
}

// A logger that writes nowhere, for tests that register thousands of endpoints.
std::shared_ptr<spdlog::logger> quiet() { return std::make_shared<spdlog::logger>("quiet"); }

// An endpoint carrying `bytes` of metadata, so that memory shows what entries and events hold.
Endpoint heavy(std::string name, size_t bytes) {
  auto e = endpoint(kj::mv(name));
  e.metadata["blob"] = std::string(bytes, 'x');
  return e;
}

TEST_F(RegistryServerTest, WatchersThatNeverReadHoldNoMoreThanTheTotalAndAReaderKeepsUp) {
  constexpr size_t MiB = size_t{1} << 20;
  server = kj::heap<RegistryServer>(loop, RegistryServerOptions{.maxQueuedEventBytes = 4 * MiB,
                                                                .logger = quiet()});
  // Ten watchers that never answer after the first batch, and one that reads everything.
  kj::Vector<schema::WatchHandle::Client> handles;
  kj::Vector<RecordingWatcher::State*> stuck;
  for (int i = 0; i < 10; ++i) {
    auto& state = newState();
    state.hold = true;
    handles.add(watch("", state));
    EXPECT_EQ(nextRecorded(loop, state), "SYNCED");
    stuck.add(&state);
  }
  auto& reader = newState();
  handles.add(watch("", reader));
  EXPECT_EQ(nextRecorded(loop, reader), "SYNCED");

  // 1000 entries of 4 KiB: unbounded, each stuck watcher would hold all 4 MiB of their events.
  uint64_t before = test::residentBytes();
  kj::Vector<schema::Lease::Client> leases;
  size_t most = 0;
  for (int i = 0; i < 1000; ++i) {
    leases.add(add(heavy("job/a-" + std::to_string(i), 4096)));
    most = std::max(most, server->queuedEventBytes());
  }
  for (int i = 0; i < 1000; ++i) {
    auto event = nextRecorded(loop, reader);
    ASSERT_EQ(event, "ADDED job/a-" + std::to_string(i) + " ready");
  }
  uint64_t after = test::residentBytes();
  std::printf("10 watchers that never read, 1000 endpoints of 4 KiB: %llu KiB before, %llu KiB "
              "after; at most %zu KiB of events queued\n",
              static_cast<unsigned long long>(before >> 10),
              static_cast<unsigned long long>(after >> 10), most >> 10);
  EXPECT_LE(most, 4 * MiB + 8192);  // the bound, passed by one event at most before shedding
  // The watchers furthest behind were cut off (their held calls keep their objects alive, so
  // the registry's count tells); the reader kept up and stays.
  EXPECT_LE(server->watcherCount(), 2u);
  EXPECT_FALSE(reader.released);
  auto probe = add(heavy("job/b-0", 16));
  EXPECT_EQ(nextRecorded(loop, reader), "ADDED job/b-0 ready");
  // Entries (4 MiB) and the bound (4 MiB), not ten watchers' 40 MiB.
  if (!test::MEMORY_IS_SANITIZED) {
    EXPECT_LT(after - before, 24 * MiB);
  }
}

TEST_F(RegistryServerTest, MemoryThatEntriesHeldIsGivenBackAfterTheyGo) {
  if (test::MEMORY_IS_SANITIZED) GTEST_SKIP() << "AddressSanitizer's allocator gives nothing back";
  server = kj::heap<RegistryServer>(loop, RegistryServerOptions{.logger = quiet()});
  uint64_t before = test::residentBytes();
  kj::Vector<schema::Lease::Client> leases;
  for (int i = 0; i < 20000; ++i) leases.add(add(heavy("job/a-" + std::to_string(i), 2048)));
  uint64_t full = test::residentBytes();
  leases.clear();
  ASSERT_TRUE(settle([&]() { return server->endpointCount() == 0; }));
  // The leases' objects go over the next turns; malloc keeps what they all freed.
  for (int i = 0; i < 100; ++i) loop.waitScope().poll();
  uint64_t gone = test::residentBytes();
  loop.advanceTime(1 * kj::SECONDS);  // the registry gives memory back a second after
  loop.waitScope().poll();
  uint64_t after = test::residentBytes();
  std::printf("20000 endpoints of 2 KiB: %llu MiB before, %llu MiB with them, %llu MiB once "
              "they went, %llu MiB a second later\n",
              static_cast<unsigned long long>(before >> 20),
              static_cast<unsigned long long>(full >> 20),
              static_cast<unsigned long long>(gone >> 20),
              static_cast<unsigned long long>(after >> 20));
  EXPECT_LT(static_cast<int64_t>(after) - static_cast<int64_t>(before),
            static_cast<int64_t>(full - before) / 4);
}

TEST_F(RegistryServerTest, DroppingTheWatchHandleEndsTheWatch) {
  auto& state = newState();
  auto handle = watch("", state);
  EXPECT_EQ(nextRecorded(loop, state), "SYNCED");
  EXPECT_EQ(server->watcherCount(), 1u);
  handle = nullptr;
  EXPECT_EQ(nextRecorded(loop, state), "(released)");
  EXPECT_EQ(server->watcherCount(), 0u);
}

TEST_F(RegistryServerTest, DrainClosesConnectionsForgetsEverythingAndRefusesLaterCalls) {
  auto path = test::socketPath("stop");
  auto address = server->listen(kj::str("unix:", path.c_str()));
  EXPECT_EQ(address, "unix:" + path);
  auto channel = Channel::open(loop, address.c_str());
  auto remote = channel->bootstrap<schema::Registry>();
  auto lease = add(endpoint("job/ps-0"), 60000, remote);
  auto local = add(endpoint("job/ps-1"), 60000);

  await(loop, server->drain());
  EXPECT_EQ(server->endpointCount(), 0u);
  EXPECT_EQ(server->listenAddresses().size(), 0u);
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);  // the socket file is gone

  auto e = awaitError(loop, lease.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::DISCONNECTED) << e.text;
  e = awaitError(loop, local.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::DISCONNECTED) << e.text;
  e = awaitError(loop, registry().resolveRequest().send());
  EXPECT_EQ(e.code, ErrorCode::DISCONNECTED) << e.text;
  await(loop, server->drain());  // again: joins the drain done
}

TEST_F(RegistryServerTest, ListeningOnATakenAddressFailsWithAddressInUse) {
  auto address = server->listen("tcp://127.0.0.1:0");
  RegistryServer second(loop);
  auto e = test::thrownBy([&]() { second.listen(address.c_str()); });
  EXPECT_EQ(e.code, ErrorCode::ADDRESS_IN_USE) << e.text;
  e = test::thrownBy([&]() { second.listen("bogus://x"); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
}

TEST_F(RegistryServerTest, ACapabilityOutlivingTheServerFailsCleanly) {
  auto lease = add(endpoint("job/ps-0"));
  auto cap = registry();
  server = nullptr;
  auto e = awaitError(loop, lease.renewRequest().send());
  EXPECT_EQ(e.code, ErrorCode::DISCONNECTED) << e.text;
  e = awaitError(loop, cap.resolveRequest().send());
  EXPECT_EQ(e.code, ErrorCode::DISCONNECTED) << e.text;
}

}  // namespace
}  // namespace troupe
