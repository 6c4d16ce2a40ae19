// TLS between ActorServers and their clients, in one process over loopback: certificates are
// made for the test with the openssl command (tests/support/test_certs.h). Server and client
// each hold their own Credentials; the loop's stay empty.

#include <stdlib.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "troupe/net/credentials.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_certs.h"

namespace troupe {
namespace {

using test::Echo;

struct TlsServer {
  explicit TlsServer(EventLoop& loop, std::shared_ptr<Credentials> credentials,
                     kj::StringPtr listen = "tls://127.0.0.1:0")
      : server(loop, job(), ActorServerOptions{.credentials = kj::mv(credentials)}) {
    server.host<Echo>("echo", kj::heap<test::EchoImpl>());
    address = server.listen(listen);
  }
  static JobContext job() {
    JobContext job;
    job.jobId = "tls";
    return job;
  }
  ActorServer server;
  std::string address;
};

class TlsTest : public ::testing::Test {
protected:
  TlsTest() { setLoopCredentials(loop, Credentials::none()); }
  ~TlsTest() noexcept override {}

  // One 64-byte echo to `address` with `credentials`: its payload back, or why it failed.
  kj::Promise<std::string> echo(const std::string& address,
                                std::shared_ptr<Credentials> credentials, size_t bytes = 64) {
    ActorRefOptions options;
    options.channel.credentials = kj::mv(credentials);
    auto ref = ActorRef<Echo>::connect(loop, address.c_str(), "echo", options);
    return ref
        .call([bytes](Echo::Client c) {
          auto r = c.echoRequest();
          auto payload = r.initPayload(bytes);
          for (size_t i = 0; i < bytes; ++i) payload[i] = static_cast<kj::byte>(i % 251);
          return r.send();
        })
        .then([bytes](auto&& response) {
          auto payload = response.getPayload();
          if (payload.size() != bytes) return std::string("wrong size");
          for (size_t i = 0; i < bytes; ++i) {
            if (payload[i] != static_cast<kj::byte>(i % 251)) return std::string("wrong bytes");
          }
          return std::string("ok");
        })
        .attach(kj::mv(ref));
  }

  test::Failure echoFails(const std::string& address, std::shared_ptr<Credentials> credentials) {
    return test::awaitError(loop, echo(address, kj::mv(credentials)));
  }

  // A client trusting the test CA cannot connect to `server`, and says `why`.
  void expectRefused(const TlsServer& server, const char* why) {
    auto failure = echoFails(server.address, test::clientCredentials());
    EXPECT_EQ(failure.code, ErrorCode::UNREACHABLE);
    EXPECT_TRUE(failure.mentions(why)) << failure.text;
  }

  EventLoop loop;
};

TEST_F(TlsTest, AServerOnTlsPublishesTlsAddressesAndAnswersAVerifiedClient) {
  TlsServer s(loop, test::serverCredentials());
  EXPECT_EQ(s.address.rfind("tls://127.0.0.1:", 0), 0u) << s.address;
  EXPECT_EQ(s.server.endpoints()[0].address, s.address);
  EXPECT_EQ(test::await(loop, echo(s.address, test::clientCredentials())), "ok");
}

TEST_F(TlsTest, LargeMessagesCrossTlsIntact) {
  TlsServer s(loop, test::serverCredentials());
  // Several TLS records and writes that do not complete at once, both ways.
  EXPECT_EQ(test::await(loop, echo(s.address, test::clientCredentials(), 24 << 20)), "ok");
}

TEST_F(TlsTest, TheDefaultListenAddressIsTlsWhenTheServerHasACertificate) {
  ActorServer withCert(loop, TlsServer::job(),
                       ActorServerOptions{.credentials = test::serverCredentials()});
  EXPECT_EQ(withCert.defaultListenAddress(), "tls://127.0.0.1:0");
  ActorServer without(loop, TlsServer::job(),
                      ActorServerOptions{.credentials = Credentials::none()});
  EXPECT_EQ(without.defaultListenAddress(), "tcp://127.0.0.1:0");
}

TEST_F(TlsTest, ListeningOnTlsWithoutACertificateIsRefused) {
  ActorServer server(loop, TlsServer::job(),
                     ActorServerOptions{.credentials = test::clientCredentials()});
  auto failure = test::thrownBy([&]() { server.listen("tls://127.0.0.1:0"); });
  EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(failure.mentions("TLS needs a certificate and its key")) << failure.text;
}

TEST_F(TlsTest, AClientThatDoesNotTrustTheCaIsRefused) {
  TlsServer s(loop, test::serverCredentials());
  // The system's trust store, which does not hold the test CA.
  auto failure = echoFails(s.address, Credentials::none());
  EXPECT_EQ(failure.code, ErrorCode::UNREACHABLE);
  EXPECT_TRUE(failure.mentions("TLS handshake with tls://127.0.0.1:")) << failure.text;
  EXPECT_TRUE(failure.mentions("not trusted")) << failure.text;
  // The server keeps serving.
  EXPECT_EQ(test::await(loop, echo(s.address, test::clientCredentials())), "ok");
}

TEST_F(TlsTest, AServerCertificateFromAnotherCaIsRefused) {
  auto& c = test::testCerts();
  TlsServer s(loop, test::tlsCredentials(c.otherCa, c.otherCert, c.otherKey));
  expectRefused(s, "TLS peer's certificate is not trusted");
}

TEST_F(TlsTest, AnExpiredServerCertificateIsRefused) {
  auto& c = test::testCerts();
  TlsServer s(loop, test::tlsCredentials(c.ca, c.expiredCert, c.expiredKey));
  expectRefused(s, "certificate has expired");
}

TEST_F(TlsTest, AServerWhoseNameDoesNotMatchIsRefusedUnlessTheNameIsGiven) {
  auto& c = test::testCerts();
  TlsServer s(loop, test::tlsCredentials(c.ca, c.wrongNameCert, c.wrongNameKey));
  expectRefused(s, "hostname mismatch");

  // Told which name the server's certificate carries, the client accepts it.
  TlsOptions named;
  named.caFile = c.ca;
  named.serverName = "elsewhere.invalid";
  auto client = std::make_shared<Credentials>(CredentialsOptions{.tls = named});
  EXPECT_EQ(test::await(loop, echo(s.address, client)), "ok");
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificateFromTheSameCa) {
  auto& c = test::testCerts();
  TlsServer s(loop, test::serverCredentials(/*requireClientCertificates=*/true));

  // No certificate: the server ends the connection during or right after the handshake.
  auto none = echoFails(s.address, test::clientCredentials());
  EXPECT_TRUE(none.code == ErrorCode::UNREACHABLE || none.code == ErrorCode::DISCONNECTED)
      << none.text;
  EXPECT_TRUE(none.mentions("certificate")) << none.text;

  auto other = echoFails(s.address, test::tlsCredentials(c.ca, c.otherCert, c.otherKey));
  EXPECT_TRUE(other.code == ErrorCode::UNREACHABLE || other.code == ErrorCode::DISCONNECTED)
      << other.text;
  EXPECT_TRUE(other.mentions("unknown ca") || other.mentions("certificate")) << other.text;

  EXPECT_EQ(test::await(loop, echo(s.address, test::tlsCredentials(c.ca, c.cert, c.key))), "ok");
}

TEST_F(TlsTest, ATlsClientAgainstAPlainServerFailsClearly) {
  TlsServer plain(loop, Credentials::none(), "tcp://127.0.0.1:0");
  auto tlsAddress = "tls://" + plain.address.substr(strlen("tcp://"));
  auto failure = echoFails(tlsAddress, test::clientCredentials());
  EXPECT_EQ(failure.code, ErrorCode::UNREACHABLE);
  EXPECT_TRUE(failure.mentions("TLS handshake with")) << failure.text;
  EXPECT_TRUE(failure.mentions("does the peer speak TLS?")) << failure.text;
  EXPECT_EQ(test::await(loop, echo(plain.address, Credentials::none())), "ok");
}

TEST_F(TlsTest, APlainClientAgainstATlsServerIsToldToUseTls) {
  TlsServer s(loop, test::serverCredentials());
  auto plainAddress = "tcp://" + s.address.substr(strlen("tls://"));
  auto failure = echoFails(plainAddress, Credentials::none());
  EXPECT_EQ(failure.code, ErrorCode::UNREACHABLE) << failure.text;
  EXPECT_TRUE(failure.mentions(("this server speaks TLS: connect to " + s.address).c_str()))
      << failure.text;
  EXPECT_EQ(test::await(loop, echo(s.address, test::clientCredentials())), "ok");
}

TEST(CredentialsTest, FilesThatCannotBeUsedAreNamedAndTheirContentsAreNot) {
  auto& c = test::testCerts();
  auto refused = [](TlsOptions tls) {
    return test::thrownBy([&]() { Credentials credentials(CredentialsOptions{.tls = tls}); });
  };
  auto missing = refused(TlsOptions{.caFile = c.dir + "/nothing.pem"});
  EXPECT_EQ(missing.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(missing.mentions("the TLS CA bundle '")) << missing.text;
  EXPECT_TRUE(missing.mentions("nothing.pem")) << missing.text;

  // A key given as the CA bundle, and a key that is not the certificate's.
  auto notCa = refused(TlsOptions{.caFile = c.key});
  EXPECT_TRUE(notCa.mentions("holds no PEM certificate")) << notCa.text;
  EXPECT_FALSE(notCa.mentions("PRIVATE KEY")) << notCa.text;
  auto mismatched = refused(TlsOptions{.caFile = c.ca, .certFile = c.cert, .keyFile = c.otherKey});
  EXPECT_TRUE(mismatched.mentions("does not belong to the certificate")) << mismatched.text;
  auto keyAsCert = refused(TlsOptions{.caFile = c.ca, .certFile = c.key, .keyFile = c.key});
  EXPECT_TRUE(keyAsCert.mentions("the TLS certificate '")) << keyAsCert.text;
  auto half = refused(TlsOptions{.caFile = c.ca, .certFile = c.cert});
  EXPECT_TRUE(half.mentions("set both or neither")) << half.text;
}

TEST(CredentialsTest, TheEnvironmentNamesTheFilesAndTheToken) {
  auto& c = test::testCerts();
  auto tokenFile = c.dir + "/token";
  FILE* f = fopen(tokenFile.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("s3cret-token\n", f);
  fclose(f);
  ASSERT_EQ(chmod(tokenFile.c_str(), 0644), 0);
  setenv("TROUPE_TOKEN_FILE", tokenFile.c_str(), 1);
  // A token file other users may read is refused, naming its mode.
  auto loose = test::thrownBy([]() { Credentials::fromEnvironment(); });
  EXPECT_TRUE(loose.mentions("other users may read it (mode 644)")) << loose.text;
  unsetenv("TROUPE_TOKEN_FILE");
  ASSERT_EQ(chmod(tokenFile.c_str(), 0600), 0);
  setenv("TROUPE_TLS_CA", c.ca.c_str(), 1);
  setenv("TROUPE_TLS_CERT", c.cert.c_str(), 1);
  setenv("TROUPE_TLS_KEY", c.key.c_str(), 1);
  setenv("TROUPE_TOKEN_FILE", tokenFile.c_str(), 1);
  KJ_DEFER({
    unsetenv("TROUPE_TLS_CA");
    unsetenv("TROUPE_TLS_CERT");
    unsetenv("TROUPE_TLS_KEY");
    unsetenv("TROUPE_TOKEN_FILE");
    unsetenv("TROUPE_TOKEN");
  });
  auto credentials = Credentials::fromEnvironment();
  EXPECT_TRUE(credentials->canServeTls());
  EXPECT_FALSE(credentials->requiresClientCertificates());
  auto token = kj::heapString("s3cret-token");
  EXPECT_TRUE(credentials->tokenMatches(token.asBytes()));  // the newline is not part of it
  EXPECT_FALSE(credentials->tokenMatches(kj::StringPtr("s3cret-tokeN").asBytes()));
  EXPECT_FALSE(credentials->tokenMatches(kj::StringPtr("s3cret").asBytes()));

  // Both token variables: which one is meant is unclear, so neither is used.
  setenv("TROUPE_TOKEN", "another", 1);
  auto both = test::thrownBy([]() { Credentials::fromEnvironment(); });
  EXPECT_TRUE(both.mentions("both TROUPE_TOKEN_FILE and TROUPE_TOKEN")) << both.text;
  EXPECT_FALSE(both.mentions("another")) << both.text;
  EXPECT_FALSE(both.mentions("s3cret")) << both.text;
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(TlsHandshakeTest, AConnectionThatNeverBeginsItsHandshakeIsClosedAtTheTimeout) {
  EventLoop loop(EventLoopOptions{.manualClock = true});
  setLoopCredentials(loop, Credentials::none());
  TlsServer s(loop, test::serverCredentials());
  auto stream = test::await(loop, loop.network()
                                      .parseAddress(Address::parse(s.address).toKjAddress())
                                      .then([](kj::Own<kj::NetworkAddress> a) {
                                        return a->connect().attach(kj::mv(a));
                                      }));
  kj::byte byte;
  auto read = stream->tryRead(&byte, 1, 1);
  loop.advanceTime(TlsOptions{}.handshakeTimeout - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(read.poll(loop.waitScope())) << "closed before the timeout";
  loop.advanceTime(1 * kj::NANOSECONDS);
  EXPECT_EQ(test::await(loop, kj::mv(read)), 0u);  // the server closed it
}

}  // namespace
}  // namespace troupe
