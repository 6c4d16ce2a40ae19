// What a registry's clients can make it hold beyond connections and watch queues: endpoints,
// watchers and jobs (live, ended, with their reasons and credentials). Each is bounded by an
// option; past it a request is refused with OVERLOADED (or the oldest ended job is forgotten),
// and the registry keeps serving. In-process, through the raw Cap'n Proto interface, except
// where a RegistryResolver client shows it retries by itself.

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/resident_memory.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::endpoint;

std::shared_ptr<spdlog::logger> quiet() { return std::make_shared<spdlog::logger>("quiet"); }

class RegistryBoundsTest : public ::testing::Test {
protected:
  RegistryBoundsTest() : loop(EventLoopOptions{.manualClock = true}) {
    setLoopCredentials(loop, Credentials::none());
  }
  ~RegistryBoundsTest() noexcept override {}

  void start(RegistryServerOptions options) {
    options.logger = quiet();
    server = kj::heap<RegistryServer>(loop, kj::mv(options));
  }

  schema::Registry::Client registry() { return server->capability(); }

  kj::Promise<schema::Lease::Client> add(const Endpoint& e, kj::StringPtr credential = "") {
    auto request = registry().registerRequest();
    e.toCapnp(request.initEndpoint());
    request.setJobCredential(credential.asBytes());
    return request.send().then([](auto&& response) { return response.getLease(); });
  }

  kj::Promise<void> setJobStatus(JobStatus status, kj::StringPtr credential = "") {
    auto request = registry().setJobStatusRequest();
    toCapnp(status, request.initStatus());
    request.setJobCredential(credential.asBytes());
    return request.send().then([](auto&&) {});
  }

  kj::Promise<std::string> createJob(kj::StringPtr jobId) {
    auto request = registry().createJobRequest();
    request.setJobId(jobId);
    return request.send().then([](auto&& response) {
      auto bytes = response.getCredential();
      return std::string(bytes.asChars().begin(), bytes.size());
    });
  }

  JobStatus jobStatus(kj::StringPtr jobId) {
    auto request = registry().jobStatusRequest();
    request.setJobId(jobId);
    return fromCapnp(
        await<capnp::Response<schema::Registry::JobStatusResults>>(loop, request.send())
            .getStatus());
  }

  kj::Promise<schema::WatchHandle::Client> watch(kj::StringPtr prefix,
                                                 test::RecordingWatcher::State& state) {
    auto request = registry().watchRequest();
    request.setPrefix(prefix);
    request.setWatcher(kj::heap<test::RecordingWatcher>(state));
    return request.send().then([](auto&& response) { return response.getHandle(); });
  }

  test::RecordingWatcher::State states[3];  // before the loop: watchers may live until it goes
  EventLoop loop;
  kj::Own<RegistryServer> server;
};

TEST_F(RegistryBoundsTest, EndedJobsPastTheBoundAreForgottenTheOldestFirst) {
  start({.maxJobs = 3});
  for (int i = 0; i < 5; ++i) {
    await(loop, setJobStatus({"j" + std::to_string(i), JobState::ENDED, "done"}));
  }
  EXPECT_EQ(jobStatus("j0").state, JobState::RUNNING);  // forgotten: open again
  EXPECT_EQ(jobStatus("j1").state, JobState::RUNNING);
  for (const char* kept : {"j2", "j3", "j4"}) {
    EXPECT_EQ(jobStatus(kept).state, JobState::ENDED) << kept;
  }
  auto late = awaitError(loop, add(endpoint("j4/a-0")));
  EXPECT_EQ(late.code, ErrorCode::JOB_ENDED) << late.text;
  await(loop, add(endpoint("j0/a-0")));  // a forgotten job's name is open
}

TEST_F(RegistryBoundsTest, WithOnlyLiveJobsAtTheBoundAnotherIsRefusedOverloadedUntilOneEnds) {
  start({.maxJobs = 2});
  auto a = await(loop, createJob("a"));
  auto b = await(loop, createJob("b"));
  auto full = awaitError(loop, createJob("c"));
  EXPECT_EQ(full.code, ErrorCode::OVERLOADED);
  EXPECT_TRUE(full.mentions("holds 2 live jobs, its limit (maxJobs)")) << full.text;
  // Claiming an open job with a credential needs a record too: refused before anything is
  // published.
  auto claim = awaitError(loop, add(endpoint("c/a-0"), std::string(64, 'c')));
  EXPECT_EQ(claim.code, ErrorCode::OVERLOADED) << claim.text;
  EXPECT_EQ(server->endpointCount(), 0u);
  // Refusals change nothing: the live jobs keep their credentials.
  EXPECT_EQ(awaitError(loop, add(endpoint("b/a-0"))).code, ErrorCode::PERMISSION_DENIED);

  await(loop, setJobStatus({"a", JobState::ENDED, "done"}, a));
  await(loop, createJob("c"));  // takes the place of the ended job
  EXPECT_EQ(jobStatus("a").state, JobState::RUNNING);
  await(loop, add(endpoint("b/a-0"), b));
}

TEST_F(RegistryBoundsTest, ALongReasonIsCutAtACharacterAndALongCredentialIsRefused) {
  start({});
  std::string reason;
  for (int i = 0; i < 100000; ++i) reason += "\xc3\xa9";  // 200,000 bytes of "é"
  await(loop, setJobStatus({"long", JobState::ENDED, reason}));
  auto kept = jobStatus("long").reason;
  EXPECT_LE(kept.size(), MAX_JOB_REASON_BYTES);
  EXPECT_GE(kept.size(), MAX_JOB_REASON_BYTES - 4);
  EXPECT_EQ(kept.substr(kept.size() - 3), "...");
  EXPECT_EQ(kept.substr(0, kept.size() - 3), reason.substr(0, kept.size() - 3));
  EXPECT_EQ((kept.size() - 3) % 2, 0u);  // "é" is never split

  std::string credential(MAX_JOB_CREDENTIAL_BYTES + 1, 'k');
  auto registration = awaitError(loop, add(endpoint("fresh/a-0"), credential));
  EXPECT_EQ(registration.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(registration.mentions("job credential presented is 257 bytes; at most 256"))
      << registration.text;
  auto status = awaitError(loop, setJobStatus({"fresh", JobState::ENDED, "x"}, credential));
  EXPECT_EQ(status.code, ErrorCode::INVALID_ARGUMENT) << status.text;
  EXPECT_EQ(jobStatus("fresh").state, JobState::RUNNING);
  // The longest credential accepted claims the job.
  credential.pop_back();
  await(loop, add(endpoint("fresh/a-0"), credential));
  EXPECT_EQ(awaitError(loop, add(endpoint("fresh/a-1"))).code, ErrorCode::PERMISSION_DENIED);
}

TEST_F(RegistryBoundsTest, EndpointsPastTheBoundAreRefusedOverloadedButANewerIncarnationReplaces) {
  start({.maxEndpoints = 2});
  auto first = await(loop, add(endpoint("job/a-0")));
  auto second = await(loop, add(endpoint("job/a-1")));
  auto full = awaitError(loop, add(endpoint("job/a-2")));
  EXPECT_EQ(full.code, ErrorCode::OVERLOADED);
  EXPECT_TRUE(full.mentions("holds 2 endpoints, its limit (maxEndpoints)")) << full.text;
  auto newer = endpoint("job/a-1", "tcp://127.0.0.1:4001");
  newer.incarnation = 2;
  auto replaced = await(loop, add(newer));
  EXPECT_EQ(server->endpointCount(), 2u);
}

TEST_F(RegistryBoundsTest, ANewerIncarnationReplacingAnOlderOneCountsAsOneRegistration) {
  start({});
  auto metric = [&](kj::StringPtr name, const MetricLabels& labels = {}) {
    return loop.metrics().collect().value(name, labels);
  };
  auto first = await(loop, add(endpoint("job/a-0")));
  EXPECT_EQ(metric("troupe_registry_registrations_total"), 1);
  auto newer = endpoint("job/a-0", "tcp://127.0.0.1:4001");
  newer.incarnation = 2;
  auto replaced = await(loop, add(newer));
  EXPECT_EQ(metric("troupe_registry_registrations_total"), 2);
  EXPECT_EQ(server->endpointCount(), 1u);
  auto stale = awaitError(loop, add(endpoint("job/a-0")));
  EXPECT_EQ(stale.code, ErrorCode::NAME_TAKEN);
  EXPECT_EQ(metric("troupe_registry_registrations_total"), 2);
  EXPECT_EQ(metric("troupe_registry_registrations_refused_total", {{"code", "name_taken"}}), 1);
}

TEST_F(RegistryBoundsTest, AResolverRegistrationRefusedOverloadedGetsInOnceThereIsRoom) {
  start({.maxEndpoints = 1});
  test::TempSocket socket("bounds");
  server->listen(("unix:" + socket.path).c_str());
  RegistryResolver client(loop, ("registry+unix:" + socket.path).c_str());
  auto holder = client.registerEndpoint(endpoint("job/a-0"));
  await(loop, holder->whenRegistered());
  auto waiting = client.registerEndpoint(endpoint("job/a-1"));
  auto registered = waiting->whenRegistered().fork();
  test::advanceInSteps(loop, 2 * kj::SECONDS, 100 * kj::MILLISECONDS);  // retries, refused
  EXPECT_FALSE(registered.addBranch().poll(loop.waitScope()));
  holder = nullptr;  // room: the next retry gets in
  test::advanceInSteps(loop, 10 * kj::SECONDS, 100 * kj::MILLISECONDS);
  await(loop, registered.addBranch());
  auto names = await(loop, client.resolve("job/"));
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].name, "job/a-1");
}

TEST_F(RegistryBoundsTest, WatchesPastTheBoundAreRefusedOverloadedUntilOneGoes) {
  start({.maxWatchers = 2});
  auto one = await(loop, watch("a/", states[0]));
  auto two = await(loop, watch("b/", states[1]));
  auto full = awaitError(loop, watch("c/", states[2]));
  EXPECT_EQ(full.code, ErrorCode::OVERLOADED);
  EXPECT_TRUE(full.mentions("has 2 watchers, its limit (maxWatchers)")) << full.text;
  one = nullptr;
  for (int i = 0; i < 10 && server->watcherCount() > 1; ++i) loop.waitScope().poll();
  ASSERT_EQ(server->watcherCount(), 1u);
  auto three = await(loop, watch("c/", states[2]));
  EXPECT_EQ(test::nextRecorded(loop, states[2]), "SYNCED");
}

TEST_F(RegistryBoundsTest, TenThousandEndedJobsWithLongReasonsHoldNoMoreThanTheBound) {
  constexpr size_t MiB = size_t{1} << 20;
  start({.maxJobs = 1000});
  std::string reason(16 * 1024, 'r');
  uint64_t before = test::residentBytes();
  for (int i = 0; i < 10000; ++i) {
    await(loop, setJobStatus({"job" + std::to_string(i), JobState::ENDED, reason}));
  }
  uint64_t after = test::residentBytes();
  std::printf("10000 ended jobs with 16 KiB reasons, maxJobs 1000: %llu KiB before, %llu KiB "
              "after (unbounded and uncut: 160 MiB of reasons)\n",
              static_cast<unsigned long long>(before >> 10),
              static_cast<unsigned long long>(after >> 10));
  EXPECT_EQ(jobStatus("job8999").state, JobState::RUNNING);
  EXPECT_EQ(jobStatus("job9000").state, JobState::ENDED);
  EXPECT_EQ(jobStatus("job9000").reason.size(), MAX_JOB_REASON_BYTES);
  if (!test::MEMORY_IS_SANITIZED) {
    EXPECT_LT(after - before, 16 * MiB);  // a thousand records of about 1.2 KiB, and malloc's slack
  }
}

}  // namespace
}  // namespace troupe
