// Job ownership in the registry, against the attacks a stranger with the cluster credential (or
// a careless second launcher) tried: each is refused now, and the job's own replicas keep
// their entries. The registry runs in-process; the owner and the stranger are RegistryResolver
// clients over a unix socket with credentials of their own.

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;

// A client of the registry whose channel presents `jobToken` as the credential of job `jobId`.
kj::Own<RegistryResolver> client(EventLoop& loop, const std::string& url, std::string jobToken,
                                 std::string jobId = "calc") {
  RegistryResolverOptions options;
  options.credentials = std::make_shared<Credentials>(
      CredentialsOptions{.jobId = kj::mv(jobId), .jobToken = kj::mv(jobToken)});
  return kj::heap<RegistryResolver>(loop, url.c_str(), options);
}

class JobOwnershipTest : public ::testing::Test {
protected:
  JobOwnershipTest()
      : loop(EventLoopOptions{.manualClock = true}),
        socket("ownership"),
        server(loop, RegistryServerOptions{.credentials = Credentials::none()}) {
    setLoopCredentials(loop, Credentials::none());
    server.listen(("unix:" + socket.path).c_str());
    url = "registry+unix:" + socket.path;
    launcher = client(loop, url, "");
    credential = await(loop, launcher->createJob("calc"));
    replicas = client(loop, url, credential);
    stranger = client(loop, url, "");
    for (uint32_t i = 0; i < 3; ++i) {
      auto e = test::endpoint("calc/calc-" + std::to_string(i),
                              "tcp://127.0.0.1:" + std::to_string(5000 + i));
      e.incarnation = 10;
      owned.add(replicas->registerEndpoint(e));
      await(loop, owned.back()->whenRegistered());
    }
  }
  ~JobOwnershipTest() noexcept override {}

  std::string names() {
    kj::Vector<kj::String> found;
    for (auto& e : await(loop, stranger->resolve("calc/"))) {
      found.add(kj::str(e.name, "@", e.incarnation));
    }
    return kj::strArray(found, ",").cStr();
  }

  test::Failure strangerRegisters(const std::string& name, uint64_t incarnation) {
    auto e = test::endpoint(name, "tcp://127.0.0.1:6666");
    e.incarnation = incarnation;
    auto registration = stranger->registerEndpoint(e);
    return awaitError(loop, registration->whenRegistered());
  }

  EventLoop loop;
  test::TempSocket socket;
  RegistryServer server;
  std::string url;
  kj::Own<RegistryResolver> launcher, replicas, stranger;
  std::string credential;
  kj::Vector<kj::Own<Registration>> owned;
};

const char* const ALL = "calc/calc-0@10,calc/calc-1@10,calc/calc-2@10";

TEST_F(JobOwnershipTest, TheCredentialIsRandomAndEveryoneMayResolveAndWatch) {
  EXPECT_EQ(credential.size(), 64u);  // 32 random bytes, in hex
  EXPECT_EQ(names(), ALL);
  auto watch = stranger->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
}

TEST_F(JobOwnershipTest, ANewerIncarnationFromAStrangerDoesNotReplaceAReplica) {
  auto failure = strangerRegisters("calc/calc-1", 99);
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED);
  EXPECT_TRUE(failure.mentions("only the owner of job 'calc' may register 'calc/calc-1'"))
      << failure.text;
  EXPECT_TRUE(failure.mentions("was not presented")) << failure.text;
  EXPECT_EQ(names(), ALL);
}

TEST_F(JobOwnershipTest, AStrangerCannotAddAMember) {
  EXPECT_EQ(strangerRegisters("calc/calc-7", 1).code, ErrorCode::PERMISSION_DENIED);
  EXPECT_EQ(names(), ALL);
}

TEST_F(JobOwnershipTest, AWrongCredentialIsRefusedLikeNone) {
  auto forger = client(loop, url, std::string(64, 'a'));
  auto e = test::endpoint("calc/calc-2", "tcp://127.0.0.1:6666");
  e.incarnation = 99;
  auto registration = forger->registerEndpoint(e);
  auto failure = awaitError(loop, registration->whenRegistered());
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED);
  EXPECT_TRUE(failure.mentions("presented is not the job's")) << failure.text;
  registration = nullptr;  // a refused registration dropped removes nothing
  EXPECT_EQ(names(), ALL);
}

TEST_F(JobOwnershipTest, AStrangerCannotEndTheJob) {
  auto failure = awaitError(loop, stranger->setJobStatus({"calc", JobState::ENDED, "mischief"}));
  EXPECT_EQ(failure.code, ErrorCode::PERMISSION_DENIED);
  EXPECT_TRUE(failure.mentions("only the owner of job 'calc' may set its state")) << failure.text;
  EXPECT_EQ(await(loop, stranger->jobStatus("calc")).state, JobState::RUNNING);
  EXPECT_EQ(names(), ALL);
}

TEST_F(JobOwnershipTest, ASecondLauncherCannotCreateALiveJobAnywhere) {
  auto other = client(loop, url, "");
  auto failure = awaitError(loop, other->createJob("calc"));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ALREADY_EXISTS);
  EXPECT_TRUE(failure.mentions("job 'calc' already exists and is live")) << failure.text;
  // Once its owner ends it, the name may be created again, with a new credential.
  await(loop, launcher->setJobStatus({"calc", JobState::ENDED, "done"}, credential));
  EXPECT_EQ(names(), "");
  auto again = await(loop, other->createJob("calc"));
  EXPECT_NE(again, credential);
}

TEST_F(JobOwnershipTest, AJobStaysLiveUntilItsOwnerEndsItEvenWithoutLauncherOrReplicas) {
  launcher = nullptr;
  owned.clear();  // the replicas go too, and may come back with the credential
  EXPECT_EQ(names(), "");
  auto other = client(loop, url, "");
  auto failure = awaitError(loop, other->createJob("calc"));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ALREADY_EXISTS);
  EXPECT_TRUE(failure.mentions("created, and not ended by its owner")) << failure.text;
  // A holder of the credential ends it; then the name is free.
  await(loop, replicas->setJobStatus({"calc", JobState::ENDED, "done"}, credential));
  await(loop, other->createJob("calc"));
}

TEST_F(JobOwnershipTest, ARefusedRegistrationClaimsNoOpenJob) {
  // An open job (nobody created it), ended: a registration with a credential is refused with
  // JOB_ENDED and must not make that credential the job's.
  auto opener = client(loop, url, "");
  await(loop, opener->setJobStatus({"open", JobState::ENDED, "over"}));
  auto claimer = client(loop, url, "mine", "open");
  auto registration = claimer->registerEndpoint(test::endpoint("open/x-0", "tcp://127.0.0.1:7"));
  EXPECT_EQ(awaitError(loop, registration->whenRegistered()).code, ErrorCode::JOB_ENDED);
  // Still open: a client without any credential may set its state.
  await(loop, opener->setJobStatus({"open", JobState::RUNNING, ""}));
}

TEST_F(JobOwnershipTest, AJobEndedByItsOwnerThenRunningAgainGetsItsReplicasBack) {
  auto watch = stranger->watch("calc/");
  for (int i = 0; i < 3; ++i) test::next(loop, *watch);
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  await(loop, launcher->setJobStatus({"calc", JobState::ENDED, "by mistake"}, credential));
  EXPECT_EQ(names(), "");
  await(loop, launcher->setJobStatus({"calc", JobState::RUNNING, ""}, credential));
  // The replicas' registrations retry with backoff (at most reconnectBackoffMax apart) and
  // find the job running.
  test::advanceInSteps(loop, 10 * kj::SECONDS, 10 * kj::MILLISECONDS);
  EXPECT_EQ(names(), ALL);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST_F(JobOwnershipTest, AReplicaWhoseEntryWasTakenOverComesBackWhenTheIntruderGoes) {
  // Even a holder of the credential (a stale copy of a replica, say) that takes a name over
  // with a newer incarnation only holds it while it lives.
  auto intruderClient = client(loop, url, credential);
  auto e = test::endpoint("calc/calc-1", "tcp://127.0.0.1:6666");
  e.incarnation = 99;
  auto intruder = intruderClient->registerEndpoint(e);
  await(loop, intruder->whenRegistered());
  EXPECT_EQ(names(), "calc/calc-0@10,calc/calc-1@99,calc/calc-2@10");
  // The replica's renewals find its lease revoked; it asks again, with backoff, and is told the
  // name is taken while the intruder holds it.
  test::advanceInSteps(loop, 10 * kj::SECONDS, 10 * kj::MILLISECONDS);
  EXPECT_EQ(names(), "calc/calc-0@10,calc/calc-1@99,calc/calc-2@10");
  intruder = nullptr;
  test::advanceInSteps(loop, 10 * kj::SECONDS, 10 * kj::MILLISECONDS);
  EXPECT_EQ(names(), ALL);
}

}  // namespace
}  // namespace troupe
