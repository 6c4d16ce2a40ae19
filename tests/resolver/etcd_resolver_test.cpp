// EtcdResolver against real etcd processes (tests/support/etcd_cluster.h): what is particular to
// etcd beside the shared conformance suite. URLs; one lease per client; a key deleted behind a
// registration's back; TLS to etcd with client certificates; a lease that lapses while its
// client is frozen; a killed member of three; etcd restarts with and without its data;
// compaction; values under the root that are not troupe's; an etcd that is down at start;
// oversized answers.
//
// etcd keeps leases in real time, so these tests use real time: short TTLs, and waits that end
// on the event they expect (or on PATIENCE, failing).

#include "troupe/resolver/etcd_resolver.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <kj/encoding.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/open_resolver.h"
#include "tests/support/child_process.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_certs.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::endpoint;

std::string base64(const std::string& text) {
  auto encoded = kj::encodeBase64(kj::arrayPtr(text.data(), text.size()).asBytes());
  return std::string(encoded.cStr());
}

// Waits `delay` of real time, running the loop.
void runFor(EventLoop& loop, kj::Duration delay) {
  test::afterRealTime(loop, delay).wait(loop.waitScope());
}

TEST(EtcdUrlTest, MembersRootAndTtlComeFromTheUrl) {
  auto options = EtcdResolver::parseUrl("etcd://10.0.0.5:2379,etcd-b/prod/troupe?ttl_ms=2500");
  ASSERT_EQ(options.members.size(), 2u);
  EXPECT_EQ(options.members[0], "tcp://10.0.0.5:2379");
  EXPECT_EQ(options.members[1], "tcp://etcd-b:2379");
  EXPECT_EQ(options.root, "prod/troupe");
  EXPECT_EQ(options.ttl, 2500 * kj::MILLISECONDS);

  auto unix = EtcdResolver::parseUrl("etcd+unix:/run/a:1,/run/b:1?root=t&ttl_ms=1000");
  ASSERT_EQ(unix.members.size(), 2u);
  EXPECT_EQ(unix.members[0], "unix:/run/a:1");
  EXPECT_EQ(unix.root, "t");

  auto secure = EtcdResolver::parseUrl("etcds://etcd-a:2379,etcd-b/t");
  ASSERT_EQ(secure.members.size(), 2u);
  EXPECT_EQ(secure.members[0], "tls://etcd-a:2379");
  EXPECT_EQ(secure.members[1], "tls://etcd-b:2379");
  EXPECT_EQ(secure.root, "t");

  auto plain = EtcdResolver::parseUrl("etcd://127.0.0.1:2379");
  EXPECT_EQ(plain.root, "troupe");
  EXPECT_EQ(plain.ttl, 10 * kj::SECONDS);
}

TEST(EtcdUrlTest, AUrlThatDoesNotParseIsRefusedNamingThePart) {
  struct Case {
    const char* url;
    const char* says;
  };
  for (auto c : {Case{"etcd://", "names no etcd member"}, Case{"etcd://a,,b", "empty member"},
                 Case{"etcd://a?ttl_ms=0", "ttl_ms must be positive"},
                 Case{"etcd://a?ttl_ms=soon", "ttl_ms takes a number"},
                 Case{"etcd://a?color=red", "unknown option 'color=red'"},
                 Case{"etcd+unix:?root=x", "names no etcd member"}}) {
    auto failure = test::thrownBy([&]() { EtcdResolver::parseUrl(c.url); });
    EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT) << c.url;
    EXPECT_TRUE(failure.mentions(c.says)) << c.url << ": " << failure.text;
  }
  EventLoop loop;
  setLoopCredentials(loop, Credentials::none());
  auto root = test::thrownBy([&]() { openResolver(loop, "etcd://a/bad root"); });
  EXPECT_EQ(root.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(root.mentions("printable ASCII without spaces")) << root.text;
}

class EtcdResolverTest : public ::testing::Test {
protected:
  explicit EtcdResolverTest(size_t members = 1) : cluster(members) {
    setLoopCredentials(loop, Credentials::none());
  }
  ~EtcdResolverTest() noexcept override {}

  kj::Own<Resolver> open(size_t ttlMs = 0) {
    return openResolver(loop, cluster.url("troupe", ttlMs).c_str());
  }

  // Waits for the watch's next event that is not `skip`.
  std::string nextBut(Watch& watch, const std::string& skip) {
    for (;;) {
      auto event = test::next(loop, watch);
      if (event != skip) return event;
    }
  }

  test::EtcdCluster cluster;
  EventLoop loop;
};

TEST_F(EtcdResolverTest, ALeaseThatLapsesWhileItsClientIsFrozenIsWrittenAgainOnThaw) {
  auto resolver = open();
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  test::ChildProcess registrant(TROUPE_TEST_REGISTRANT_PATH,
                                {cluster.url("troupe", 1000), "calc/calc-0", "--ttl-ms", "1000"});
  EXPECT_EQ(registrant.readLine(), "REGISTERED calc/calc-0");
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");

  ASSERT_TRUE(registrant.freeze());
  // etcd expires the lease (at least its minimum TTL) and deletes the key.
  EXPECT_EQ(test::next(loop, *watch), "REMOVED calc/calc-0 ready");
  registrant.thaw();
  // Its next refresh finds the lease gone: a new lease, the key written again.
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
  registrant.kill(SIGTERM);
  EXPECT_EQ(registrant.wait(), 0);
  EXPECT_EQ(test::next(loop, *watch), "REMOVED calc/calc-0 ready");  // revoked on the way out
}

TEST_F(EtcdResolverTest, AnEtcdThatIsDownAtStartIsRetriedUntilItAnswers) {
  cluster.kill(0);
  auto resolver = open();
  auto registration = resolver->registerEndpoint(endpoint("calc/calc-0"));
  auto registered = registration->whenRegistered().fork();
  runFor(loop, 500 * kj::MILLISECONDS);
  EXPECT_FALSE(registered.addBranch().poll(loop.waitScope())) << "registered with no etcd running";
  cluster.restart(0);
  await(loop, registered.addBranch());
  auto found = await(loop, resolver->resolve("calc/"));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "calc/calc-0");
}

TEST_F(EtcdResolverTest, ARestartWithItsDataKeepsRegistrationsAndTheWatchGoesOn) {
  auto resolver = open(2000);
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  auto first = resolver->registerEndpoint(endpoint("calc/calc-0"));
  await(loop, first->whenRegistered());
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");

  cluster.restart(0);
  // The watch reads everything again (nothing differs: only SYNCED), then follows new writes.
  auto second = resolver->registerEndpoint(endpoint("calc/calc-1"));
  await(loop, second->whenRegistered());
  EXPECT_EQ(nextBut(*watch, "SYNCED"), "ADDED calc/calc-1 ready");
  EXPECT_EQ(await(loop, resolver->resolve("calc/")).size(), 2u);
}

TEST_F(EtcdResolverTest, ARestartWithoutItsDataBringsEveryRegistrationBackByItself) {
  auto resolver = open(2000);
  auto registration = resolver->registerEndpoint(endpoint("calc/calc-0"));
  await(loop, registration->whenRegistered());
  cluster.restartEmpty();
  auto watch = resolver->watch("calc/");
  // Whatever the snapshot holds, the registration comes back within its refresh interval.
  EXPECT_EQ(nextBut(*watch, "SYNCED"), "ADDED calc/calc-0 ready");
}

TEST_F(EtcdResolverTest, CompactionDuringAWatchLosesNothing) {
  auto resolver = open();
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  auto a = resolver->registerEndpoint(endpoint("calc/calc-0"));
  await(loop, a->whenRegistered());
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
  a->setState(EndpointState::DRAINING);
  EXPECT_EQ(test::next(loop, *watch), "CHANGED calc/calc-0 draining");
  cluster.compact(cluster.revision());
  auto b = resolver->registerEndpoint(endpoint("calc/calc-1"));
  await(loop, b->whenRegistered());
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-1 ready");
  a = nullptr;
  EXPECT_EQ(test::next(loop, *watch), "REMOVED calc/calc-0 draining");
}

TEST_F(EtcdResolverTest, ValuesUnderTheRootThatAreNotTroupesAreSkipped) {
  auto resolver = open();
  auto garbage = [&](const std::string& key, const std::string& value) {
    auto reply = cluster.post(
        0, "/v3/kv/put", "{\"key\":\"" + base64(key) + "\",\"value\":\"" + base64(value) + "\"}");
    ASSERT_EQ(reply.status, 200) << reply.body;
  };
  garbage("troupe/endpoints/calc/calc-9", "not json");
  garbage("troupe/endpoints/calc/not-a-name!", "{}");
  garbage("troupe/jobs/calc", "[1,2,3]");
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  EXPECT_EQ(await(loop, resolver->resolve("calc/")).size(), 0u);
  garbage("troupe/endpoints/calc/calc-8", "{\"name\":\"calc/other-1\"}");  // names another key
  auto good = resolver->registerEndpoint(endpoint("calc/calc-0"));
  await(loop, good->whenRegistered());
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
  auto found = await(loop, resolver->resolve("calc/"));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "calc/calc-0");
}

TEST_F(EtcdResolverTest, AnAnswerOverTheSizeLimitFailsWithMessageTooLarge) {
  auto resolver = open();
  kj::Vector<kj::Own<Registration>> held;
  for (int i = 0; i < 20; ++i) {
    auto e = endpoint("calc/calc-" + std::to_string(i));
    e.metadata["pad"] = std::string(200, 'p');
    held.add(resolver->registerEndpoint(e));
    await(loop, held.back()->whenRegistered());
  }
  auto options = EtcdResolver::parseUrl(cluster.url().c_str());
  options.maxResponseBytes = 2048;
  EtcdResolver small(loop, options);
  auto failure = awaitError(loop, small.resolve("calc/"));
  EXPECT_EQ(failure.code, ErrorCode::MESSAGE_TOO_LARGE);
  EXPECT_TRUE(failure.mentions("over the limit of 2048 bytes")) << failure.text;
  EXPECT_EQ(await(loop, small.resolve("calc/calc-2")).size(), 1u);  // small answers still come
}

// Sockets this process has open.
size_t openSockets() {
  size_t count = 0;
  for (auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    auto target = std::filesystem::read_symlink(entry.path(), error);
    if (!error && target.string().rfind("socket:", 0) == 0) ++count;
  }
  return count;
}

TEST_F(EtcdResolverTest, AThousandWatchesShareAFewConnections) {
  auto resolver = open();
  size_t before = openSockets();
  kj::Vector<kj::Own<Watch>> watches;
  for (int i = 0; i < 1000; ++i) watches.add(resolver->watch(kj::str("job", i, "/")));
  size_t most = before;
  for (auto& watch : watches) {
    most = std::max(most, openSockets());
    ASSERT_EQ(test::next(loop, *watch), "SYNCED");
  }
  std::printf("1000 watches: %zu sockets before, at most %zu while they started\n", before, most);
  EXPECT_LE(most, before + 16 + 1);  // the requests in flight at most, and the one stream
  auto registration = resolver->registerEndpoint(endpoint("job999/a-0"));
  await(loop, registration->whenRegistered());
  EXPECT_EQ(test::next(loop, *watches[999]), "ADDED job999/a-0 ready");
}

// The leases etcd holds, from POST /v3/lease/leases.
size_t leaseCount(const test::EtcdCluster& cluster) {
  auto reply = cluster.post(0, "/v3/lease/leases", "{}");
  EXPECT_EQ(reply.status, 200) << reply.body;
  size_t count = 0;
  for (size_t at = reply.body.find("\"ID\""); at != std::string::npos;
       at = reply.body.find("\"ID\"", at + 1)) {
    ++count;
  }
  return count;
}

TEST_F(EtcdResolverTest, EveryRegistrationOfAClientSharesOneLeaseAndDropsOnlyItsOwnKey) {
  auto resolver = open();
  kj::Vector<kj::Own<Registration>> registrations;
  for (int i = 0; i < 50; ++i) {
    registrations.add(resolver->registerEndpoint(endpoint(kj::str("calc/calc-", i).cStr())));
  }
  for (auto& registration : registrations) await(loop, registration->whenRegistered());
  EXPECT_EQ(leaseCount(cluster), 1u);

  auto watch = resolver->watch("calc/");
  for (int i = 0; i < 50; ++i) ASSERT_EQ(test::next(loop, *watch).rfind("ADDED calc/calc-", 0), 0u);
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  registrations[7] = nullptr;  // one goes: its key only, the lease stays for the others
  EXPECT_EQ(test::next(loop, *watch), "REMOVED calc/calc-7 ready");
  EXPECT_EQ(await(loop, resolver->resolve("calc/")).size(), 49u);
  EXPECT_EQ(leaseCount(cluster), 1u);

  registrations.clear();  // the last one revokes the lease, which takes every key with it
  for (int i = 0; i < 49; ++i) {
    ASSERT_EQ(test::next(loop, *watch).rfind("REMOVED calc/calc-", 0), 0u);
  }
  EXPECT_EQ(leaseCount(cluster), 0u);
  EXPECT_EQ(await(loop, resolver->resolve("calc/")).size(), 0u);
}

TEST_F(EtcdResolverTest, AKeyDeletedBehindItsRegistrationsBackIsWrittenAgain) {
  auto resolver = open(1000);  // checked after each keepalive, a third of a second apart
  auto registration = resolver->registerEndpoint(endpoint("calc/calc-0"));
  auto bystander = resolver->registerEndpoint(endpoint("calc/calc-1"));
  await(loop, registration->whenRegistered());
  await(loop, bystander->whenRegistered());
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-1 ready");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");

  auto reply = cluster.post(0, "/v3/kv/deleterange",
                            "{\"key\":\"" + base64("troupe/endpoints/calc/calc-0") + "\"}");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(test::next(loop, *watch), "REMOVED calc/calc-0 ready");
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
  EXPECT_EQ(await(loop, resolver->resolve("calc/")).size(), 2u);
  EXPECT_EQ(leaseCount(cluster), 1u);
}

class EtcdClusterOfThreeTest : public EtcdResolverTest {
protected:
  EtcdClusterOfThreeTest() : EtcdResolverTest(3) {}
};

TEST_F(EtcdClusterOfThreeTest, KillingTheMemberAClientTalksToLosesNoRegistration) {
  auto resolver = open(2000);
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  auto first = resolver->registerEndpoint(endpoint("calc/calc-0"));
  await(loop, first->whenRegistered());
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");

  cluster.kill(0);  // the first member listed: the one every request went to
  auto second = resolver->registerEndpoint(endpoint("calc/calc-1"));
  await(loop, second->whenRegistered());
  EXPECT_EQ(nextBut(*watch, "SYNCED"), "ADDED calc/calc-1 ready");
  // Three TTLs later the first registration is still there: its refreshes went elsewhere.
  runFor(loop, 6 * kj::SECONDS);
  auto seen = test::pending(loop, *watch);
  while (seen == "SYNCED") seen = test::pending(loop, *watch);  // it read everything again
  EXPECT_EQ(seen, "(none)") << "the watch saw a registration go";
  auto found = await(loop, resolver->resolve("calc/"));
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].name, "calc/calc-0");
}

// One member that also serves TLS, and lets in only clients presenting a certificate from the
// test CA (etcd's --client-cert-auth).
class EtcdOverTlsTest : public ::testing::Test {
protected:
  EtcdOverTlsTest()
      : certs(test::testCerts()), cluster(1, test::EtcdTls{certs.cert, certs.key, certs.ca}) {
    setLoopCredentials(loop, Credentials::none());
  }
  ~EtcdOverTlsTest() noexcept override {}

  kj::Own<Resolver> open(std::shared_ptr<Credentials> credentials) {
    EtcdResolverOptions options;
    options.members = {cluster.tlsAddress(0)};
    options.credentials = kj::mv(credentials);
    return kj::heap<EtcdResolver>(loop, kj::mv(options));
  }

  const test::TestCerts& certs;
  test::EtcdCluster cluster;
  EventLoop loop;
};

TEST_F(EtcdOverTlsTest, AClientWithTheCaAndACertificateRegistersAndWatchesOverTls) {
  auto resolver = open(test::tlsCredentials(certs.ca, certs.cert, certs.key));
  auto watch = resolver->watch("calc/");
  EXPECT_EQ(test::next(loop, *watch), "SYNCED");
  auto registration = resolver->registerEndpoint(endpoint("calc/calc-0"));
  await(loop, registration->whenRegistered());
  EXPECT_EQ(test::next(loop, *watch), "ADDED calc/calc-0 ready");
  EXPECT_TRUE(cluster.get("troupe/endpoints/calc/calc-0").has_value());
  registration = nullptr;
  EXPECT_EQ(test::next(loop, *watch), "REMOVED calc/calc-0 ready");
}

TEST_F(EtcdOverTlsTest, AnUntrustedMemberOrAClientWithoutACertificateIsRefusedClearly) {
  // The member's certificate is not from the CA this client trusts.
  auto stranger = open(test::tlsCredentials(certs.otherCa, certs.otherCert, certs.otherKey));
  auto untrusted = awaitError(loop, stranger->resolve("calc/"));
  EXPECT_EQ(untrusted.code, ErrorCode::UNREACHABLE) << untrusted.text;
  EXPECT_TRUE(untrusted.mentions(("TLS handshake with " + cluster.tlsAddress(0)).c_str()))
      << untrusted.text;
  EXPECT_TRUE(untrusted.mentions("not trusted")) << untrusted.text;

  // It trusts the member but has no certificate of its own: etcd turns it away.
  auto anonymous = open(test::tlsCredentials(certs.ca));
  auto refused = awaitError(loop, anonymous->resolve("calc/"));
  EXPECT_EQ(refused.code, ErrorCode::UNREACHABLE) << refused.text;
  EXPECT_TRUE(refused.mentions(cluster.tlsAddress(0).c_str())) << refused.text;
  EXPECT_TRUE(refused.mentions("requires client certificates (--client-cert-auth)"))
      << refused.text;

  // Plain HTTP to the TLS listener.
  EtcdResolverOptions plainOptions;
  plainOptions.members = {"tcp://" + cluster.tlsAddress(0).substr(strlen("tls://"))};
  EtcdResolver plain(loop, plainOptions);
  auto hungUp = awaitError(loop, plain.resolve("calc/"));
  EXPECT_EQ(hungUp.code, ErrorCode::UNREACHABLE) << hungUp.text;
  EXPECT_TRUE(hungUp.mentions("use tls:// members")) << hungUp.text;

  // Neither wrote anything, and a registration through them keeps trying, unregistered.
  auto registration = anonymous->registerEndpoint(endpoint("calc/calc-0"));
  auto pending = registration->whenRegistered();
  EXPECT_FALSE(pending.poll(loop.waitScope()));
  EXPECT_EQ(cluster.get("troupe/endpoints/calc/calc-0"), std::nullopt);
}

}  // namespace
}  // namespace troupe
