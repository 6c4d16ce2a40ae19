// The cluster token at the bootstrap: an ActorServer with a token hands out nothing until a
// connection presents it, tells a client without it or with a wrong one UNAUTHENTICATED, closes
// a connection after 3 refusals, and never logs a token. One process, over loopback.

#include <capnp/rpc-twoparty.h>
#include <gtest/gtest.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_certs.h"

namespace troupe {
namespace {

using test::Echo;

const std::string TOKEN = "cluster-secret-7f3a";

std::shared_ptr<Credentials> withToken(const std::string& token) {
  return std::make_shared<Credentials>(CredentialsOptions{.token = token});
}

class AuthenticationTest : public ::testing::Test {
protected:
  AuthenticationTest() : sink(std::make_shared<test::LineSink>()) {
    setLoopCredentials(loop, Credentials::none());
  }
  ~AuthenticationTest() noexcept override {}

  // A server hosting "echo", with `credentials`, listening on `listen`.
  kj::Own<ActorServer> server(std::shared_ptr<Credentials> credentials,
                              kj::StringPtr listen = "tcp://127.0.0.1:0") {
    JobContext job;
    job.jobId = "auth";
    auto s = kj::heap<ActorServer>(loop, job,
                                   ActorServerOptions{.logger = test::loggerFor(sink),
                                                      .credentials = kj::mv(credentials)});
    s->host<Echo>("echo", kj::heap<test::EchoImpl>(7));
    address = s->listen(listen);
    return s;
  }

  // whoami on "echo" with `credentials`: the incarnation it answers with.
  kj::Promise<uint64_t> whoami(std::shared_ptr<Credentials> credentials) {
    ActorRefOptions options;
    options.channel.credentials = kj::mv(credentials);
    auto ref = ActorRef<Echo>::connect(loop, address.c_str(), "echo", options);
    return ref.call([](Echo::Client c) { return c.whoamiRequest().send(); })
        .then([](auto&& r) { return r.getIncarnation(); })
        .attach(kj::mv(ref));
  }

  // A bare connection to the server, for a plain Cap'n Proto client.
  kj::Own<kj::AsyncIoStream> connect() {
    return test::await(loop, loop.network()
                                 .parseAddress(Address::parse(address).toKjAddress())
                                 .then([](kj::Own<kj::NetworkAddress> a) {
                                   return a->connect().attach(kj::mv(a));
                                 }));
  }

  std::shared_ptr<test::LineSink> sink;
  EventLoop loop;
  std::string address;
};

TEST_F(AuthenticationTest, TheRightTokenIsLetIn) {
  auto s = server(withToken(TOKEN));
  EXPECT_EQ(test::await(loop, whoami(withToken(TOKEN))), 7u);
}

TEST_F(AuthenticationTest, NoTokenIsRefusedWithUnauthenticated) {
  auto s = server(withToken(TOKEN));
  auto failure = test::awaitError(loop, whoami(Credentials::none()));
  EXPECT_EQ(failure.code, ErrorCode::UNAUTHENTICATED);
  EXPECT_TRUE(failure.mentions("requires the cluster token, and none was presented"))
      << failure.text;
  // Another client is served all the same.
  EXPECT_EQ(test::await(loop, whoami(withToken(TOKEN))), 7u);
}

TEST_F(AuthenticationTest, AWrongTokenIsRefusedAndNoTokenAppearsInMessagesOrLogs) {
  auto s = server(withToken(TOKEN));
  const std::string wrong = "guess-0001";
  auto failure = test::awaitError(loop, whoami(withToken(wrong)));
  EXPECT_EQ(failure.code, ErrorCode::UNAUTHENTICATED);
  EXPECT_TRUE(failure.mentions("the cluster token presented is not this server's")) << failure.text;
  EXPECT_FALSE(failure.mentions(TOKEN.c_str()));
  EXPECT_FALSE(failure.mentions(wrong.c_str()));
  test::await(loop, sink->whenLogged("refused a connection from 127.0.0.1:"));
  EXPECT_EQ(sink->count("a wrong cluster token (1 of 3 tries)"), 1u);
  EXPECT_EQ(sink->count(TOKEN), 0u);
  EXPECT_EQ(sink->count(wrong), 0u);
}

TEST_F(AuthenticationTest, AConnectionIsClosedAfterThreeRefusals) {
  auto s = server(withToken(TOKEN));
  // A plain Cap'n Proto client, free to ask as often as it likes on one connection.
  auto stream = connect();
  capnp::TwoPartyClient client(*stream);
  auto gate = client.bootstrap().castAs<schema::Authenticator>();
  auto attempt = [&](const std::string& token) {
    auto request = gate.authenticateRequest();
    request.setToken(kj::StringPtr(token.c_str()).asBytes());
    return request.send().then([](auto&&) {});
  };
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(test::awaitError(loop, attempt("wrong")).code, ErrorCode::UNAUTHENTICATED) << i;
  }
  // The third refusal closed the connection: even the right token is too late on it.
  EXPECT_EQ(test::awaitError(loop, attempt(TOKEN)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(sink->count("(3 of 3 tries; closing it)"), 1u);
  EXPECT_EQ(test::await(loop, whoami(withToken(TOKEN))), 7u);
}

TEST_F(AuthenticationTest, NothingButAuthenticateIsOffered) {
  auto s = server(withToken(TOKEN));
  auto stream = connect();
  capnp::TwoPartyClient client(*stream);
  // A client that skips authentication and calls the bootstrap as an ActorHost reaches nothing.
  auto host = client.bootstrap().castAs<schema::ActorHost>();
  auto failure = test::awaitError(loop, host.listActorsRequest().send().then([](auto&&) {}));
  EXPECT_EQ(failure.code, ErrorCode::UNIMPLEMENTED) << failure.text;
}

TEST_F(AuthenticationTest, AServerWithoutATokenLetsEveryoneIn) {
  auto s = server(Credentials::none());
  EXPECT_EQ(test::await(loop, whoami(Credentials::none())), 7u);
  EXPECT_EQ(test::await(loop, whoami(withToken("anything"))), 7u);
}

TEST_F(AuthenticationTest, TheTokenWorksOverTls) {
  auto& c = test::testCerts();
  auto s = server(test::serverCredentials(false, TOKEN), "tls://127.0.0.1:0");
  EXPECT_EQ(test::await(loop, whoami(test::clientCredentials(TOKEN))), 7u);
  auto failure = test::awaitError(loop, whoami(test::tlsCredentials(c.ca, "", "", false, "x")));
  EXPECT_EQ(failure.code, ErrorCode::UNAUTHENTICATED);
}

TEST_F(AuthenticationTest, AMutualTlsServerWithoutATokenLetsNoOneInOnItsPlainListeners) {
  auto s = server(test::serverCredentials(/*requireClientCertificates=*/true));
  auto failure = test::awaitError(loop, whoami(Credentials::none()));
  EXPECT_EQ(failure.code, ErrorCode::UNAUTHENTICATED);
  EXPECT_TRUE(failure.mentions("only clients with a certificate from its CA, over tls://"))
      << failure.text;
}

TEST_F(AuthenticationTest, AClientCertificateUnderMutualTlsStandsForTheToken) {
  auto& c = test::testCerts();
  auto s = server(test::serverCredentials(/*requireClientCertificates=*/true, TOKEN),
                  "tls://127.0.0.1:0");
  EXPECT_EQ(test::await(loop, whoami(test::tlsCredentials(c.ca, c.cert, c.key))), 7u);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(OpenListenerTest, OnlyLoopbackAndUnixSocketsAreClosedToOtherMachines) {
  for (auto text : {"tcp://127.0.0.1:1", "tls://127.9.0.1:1", "tcp://[::1]:1", "tcp://localhost:1",
                    "unix:/tmp/x.sock"}) {
    EXPECT_FALSE(reachableFromOtherMachines(Address::parse(text))) << text;
  }
  for (auto text : {"tcp://0.0.0.0:1", "tcp://[::]:1", "tls://10.0.0.5:1", "tcp://node7:1",
                    "tcp://128.0.0.1:1"}) {
    EXPECT_TRUE(reachableFromOtherMachines(Address::parse(text))) << text;
  }
}

TEST(OpenListenerTest, AnOpenAddressNeedsCredentialsThatAuthenticateClients) {
  auto open = Address::parse("tcp://0.0.0.0:7700");
  auto refused = test::thrownBy([&]() { refuseOpenListener(open, *Credentials::none(), "--x"); });
  EXPECT_EQ(refused.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(refused.mentions("refusing to listen on tcp://0.0.0.0:7700 without credentials"))
      << refused.text;
  EXPECT_TRUE(refused.mentions("or say --x to allow it")) << refused.text;
  // A server certificate alone proves the server, not its clients.
  auto& c = test::testCerts();
  EXPECT_EQ(
      test::thrownBy([&]() { refuseOpenListener(open, *test::serverCredentials(), "--x"); }).code,
      ErrorCode::INVALID_ARGUMENT);
  // A token lets it listen; client certificates only on tls://, where they are asked for; so
  // does loopback.
  refuseOpenListener(open, *withToken("t"), "--x");
  auto mutual = test::tlsCredentials(c.ca, c.cert, c.key, true);
  refuseOpenListener(Address::parse("tls://0.0.0.0:7700"), *mutual, "--x");
  EXPECT_EQ(test::thrownBy([&]() { refuseOpenListener(open, *mutual, "--x"); }).code,
            ErrorCode::INVALID_ARGUMENT);
  refuseOpenListener(Address::parse("tcp://127.0.0.1:7700"), *Credentials::none(), "--x");
  // A host name that merely starts with 127. is not loopback.
  EXPECT_TRUE(reachableFromOtherMachines(Address::parse("tcp://127.example.com:1")));
}

}  // namespace
}  // namespace troupe
