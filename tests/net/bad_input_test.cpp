// Bad input reaching a server: it gets a clear error on the side that caused it, and the server
// keeps serving everyone else.

#include <string>

#include <capnp/rpc.capnp.h>
#include <capnp/serialize-async.h>
#include <gtest/gtest.h>

#include "troupe/net/bytes.h"
#include "troupe/net/limits.h"
#include "tests/support/server_fixture.h"

namespace troupe {
namespace {

using test::Blocker;
using test::Echo;

class BadInputTest : public test::ServerFixture {
protected:
  kj::Promise<capnp::Response<Echo::EchoResults>> echoBytes(ActorRef<Echo>& echo, size_t size) {
    return echo.call([size](Echo::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{size / sizeof(capnp::word) + 16, 0});
      auto data = q.initPayload(size);
      for (size_t i = 0; i < size; i += 4096) data[i] = static_cast<kj::byte>(i / 4096);
      return q.send();
    });
  }

  // Opens a raw TCP connection to the server.
  kj::Own<kj::AsyncIoStream> rawConnection() {
    auto a = Address::parse(address.c_str());
    return loop.network().parseAddress(a.toKjAddress()).wait(ws())->connect().wait(ws());
  }
};

TEST_F(BadInputTest, GarbageBytesCloseOnlyThatConnection) {
  auto raw = rawConnection();
  // A frame header claiming 2^31 segments: nonsense.
  kj::byte garbage[64];
  memset(garbage, 0xff, sizeof(garbage));
  raw->write(garbage, sizeof(garbage)).wait(ws());
  // The server hangs up on it.
  auto rest = raw->readAllBytes().wait(ws());
  EXPECT_LT(rest.size(), 4096u);
  expectServing();
}

TEST_F(BadInputTest, ATruncatedFrameCloseOnlyThatConnection) {
  auto raw = rawConnection();
  // One segment of 1000 words announced, 16 bytes delivered, then the sender goes away.
  uint32_t header[2] = {0, 1000};
  raw->write(header, sizeof(header)).wait(ws());
  raw->write("0123456789abcdef", 16).wait(ws());
  raw->shutdownWrite();
  auto rest = raw->readAllBytes().wait(ws());
  EXPECT_LT(rest.size(), 4096u);
  expectServing();
}

TEST_F(BadInputTest, AFrameOverTheLimitIsRefusedBeforeItIsRead) {
  auto raw = rawConnection();
  // One segment announced at 1 GiB: over the 512 MiB limit, so nothing is allocated for it.
  uint32_t header[2] = {0, (1u << 30) / 8};
  raw->write(header, sizeof(header)).wait(ws());
  auto rest = raw->readAllBytes().wait(ws());
  EXPECT_LT(rest.size(), 4096u);
  expectServing();
}

TEST_F(BadInputTest, ARequestOverTheSendersLimitFailsOnlyThatCall) {
  auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo",
                                      {.channel = {.maxMessageBytes = 1 << 20}});
  try {
    echoBytes(echo, 2 << 20).wait(ws());
    FAIL() << "a 2 MiB request over a 1 MiB limit must fail";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::MESSAGE_TOO_LARGE) << e.getDescription().cStr();
  }
  // The same connection still works.
  auto r = echoBytes(echo, 1000).wait(ws());
  EXPECT_EQ(r.getPayload().size(), 1000u);
}

// The error of a request over the limit says so, names the limit and what to use instead.
void expectTooLarge(const kj::Exception& e) {
  std::string description = e.getDescription().cStr();
  EXPECT_EQ(errorCode(e), ErrorCode::MESSAGE_TOO_LARGE) << description;
  EXPECT_TRUE(callNeverRan(errorCode(e)));
  EXPECT_NE(description.find("512 MiB"), std::string::npos) << description;
  EXPECT_NE(description.find("blobs"), std::string::npos) << description;
}

TEST_F(BadInputTest, AValueTooLargeForAnyMessageFailsBeforeItIsSent) {
  auto echo = ref<Echo>("echo");
  constexpr size_t SIZE = size_t{512} << 20;  // Cap'n Proto's Data hold less
  // Built in the message: refused before anything is allocated.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                echo.call([](Echo::Client c) {
                      auto q = c.echoRequest();
                      q.initPayload(SIZE);
                      return q.send();
                    })
                    .wait(ws());
              })) {
    expectTooLarge(*e);
  } else {
    ADD_FAILURE() << "a 512 MiB Data went through";
  }
  // Referred to: memory of the caller's own, never touched, so never resident.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                echo.call([](Echo::Client c) {
                      auto q = c.echoRequest();
                      kj::Array<const kj::byte> bytes = kj::heapArray<kj::byte>(SIZE);
                      adoptBytes(q, &Echo::EchoParams::Builder::adoptPayload, kj::mv(bytes));
                      return q.send();
                    })
                    .wait(ws());
              })) {
    expectTooLarge(*e);
  } else {
    ADD_FAILURE() << "a 512 MiB Data went through";
  }
  // Nothing was sent: the connection serves the next call.
  EXPECT_EQ(echoBytes(echo, 1000).wait(ws()).getPayload().size(), 1000u);
  EXPECT_EQ(echo.channel().connectionsMade(), 1u);
}

// Answers an echo with the size of its payload (8 bytes) and its last byte.
class Measurer final : public Echo::Server {
protected:
  kj::Promise<void> echo(EchoContext context) override {
    auto in = context.getParams().getPayload();
    auto out = context.getResults().initPayload(9);
    uint64_t size = in.size();
    memcpy(out.begin(), &size, sizeof(size));
    out[8] = size == 0 ? 0 : in[size - 1];
    return kj::READY_NOW;
  }
};

TEST_F(BadInputTest, ARequestJustUnderTheDefaultLimitGoesAndOneJustOverIsNotSent) {
  server->host<Echo>("measurer", kj::heap<Measurer>());
  auto measurer = ref<Echo>("measurer");
  // Once the actor is found, the payload is referred to, not copied: only the pages written
  // become resident.
  EXPECT_EQ(echoBytes(measurer, 100).wait(ws()).getPayload().size(), 9u);
  auto measure = [&](size_t size) {
    return measurer.call([size](Echo::Client c) {
      auto q = c.echoRequest();
      auto bytes = kj::heapArray<kj::byte>(size);
      bytes[size - 1] = 0x5a;
      adoptBytes(q, &Echo::EchoParams::Builder::adoptPayload,
                 kj::Array<const kj::byte>(kj::mv(bytes)));
      return q.send();
    });
  };
  // The RPC call around a payload takes a few hundred bytes of the message.
  constexpr size_t UNDER = DEFAULT_MAX_MESSAGE_BYTES - 4096;
  auto r = measure(UNDER).wait(ws());
  ASSERT_EQ(r.getPayload().size(), 9u);
  uint64_t size;
  memcpy(&size, r.getPayload().begin(), sizeof(size));
  EXPECT_EQ(size, UNDER);
  EXPECT_EQ(r.getPayload()[8], 0x5a);

  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { measure(DEFAULT_MAX_MESSAGE_BYTES - 8).wait(ws()); })) {
    expectTooLarge(*e);
  } else {
    ADD_FAILURE() << "a message over the limit went through";
  }
  EXPECT_EQ(echoBytes(measurer, 100).wait(ws()).getPayload().size(), 9u);
  EXPECT_EQ(measurer.channel().connectionsMade(), 1u);
}

TEST_F(BadInputTest, AMessageOverTheReceiversLimitDropsThatConnectionOnly) {
  // A server with a 1 MiB limit, a client with the default (512 MiB).
  ActorServer small(loop, JobContext(), {.maxMessageBytes = 1 << 20});
  small.host<Echo>("echo", kj::heap<test::EchoImpl>());
  auto smallAddress = small.listen("tcp://127.0.0.1:0");
  auto echo = ActorRef<Echo>::connect(loop, smallAddress.c_str(), "echo");
  try {
    echoBytes(echo, 2 << 20).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    auto code = errorCode(e);
    EXPECT_TRUE(code == ErrorCode::MESSAGE_TOO_LARGE || code == ErrorCode::DISCONNECTED)
        << e.getDescription().cStr();
  }
  // The server still serves, and the same ActorRef connects again for its next call rather than
  // failing it with the dropped connection's error.
  EXPECT_EQ(echoBytes(echo, 100).wait(ws()).getPayload().size(), 100u);
  auto other = ActorRef<Echo>::connect(loop, smallAddress.c_str(), "echo");
  EXPECT_EQ(echoBytes(other, 100).wait(ws()).getPayload().size(), 100u);
}

TEST_F(BadInputTest, TheNextCallOnTheSameRefAfterAnOversizedOneConnectsAgain) {
  ActorServer small(loop, JobContext(), {.maxMessageBytes = 1 << 20});
  small.host<Echo>("echo", kj::heap<test::EchoImpl>());
  auto smallAddress = small.listen("tcp://127.0.0.1:0");
  auto echo = ActorRef<Echo>::connect(loop, smallAddress.c_str(), "echo");
  for (int i = 0; i < 30; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(echoBytes(echo, 100).wait(ws()).getPayload().size(), 100u);
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { echoBytes(echo, 2 << 20).wait(ws()); })) {
      auto code = errorCode(*e);
      EXPECT_TRUE(code == ErrorCode::MESSAGE_TOO_LARGE || code == ErrorCode::DISCONNECTED)
          << e->getDescription().cStr();
    } else {
      ADD_FAILURE() << "the oversized call went through";
    }
    // At once, before the loop may have run the connection's teardown.
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  EXPECT_EQ(echoBytes(echo, 100).wait(ws()).getPayload().size(), 100u);
                })) {
      ADD_FAILURE() << "the call after the oversized one failed: " << e->getDescription().cStr();
    }
  }
}

// What a server that aborts a connection sends (Cap'n Proto's Abort): here at once, with the
// socket left open, so the client learns of the end from the message alone.
kj::Promise<void> sendAbort(kj::AsyncIoStream& stream) {
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto abort = message->initRoot<capnp::rpc::Message>().initAbort();
  abort.setType(capnp::rpc::Exception::Type::FAILED);
  abort.setReason("troupe.message_too_large: closing the connection");
  auto& built = *message;
  return capnp::writeMessage(stream, built).attach(kj::mv(message));
}

TEST_F(BadInputTest, ACallRightAfterThePeerAbortedTheConnectionConnectsAgain) {
  // The stale error after an oversized message: the server's Abort fails the calls in flight
  // before the channel has seen the connection go, and the next call must not be sent over it.
  auto listener = loop.network().parseAddress("127.0.0.1", 0).wait(ws())->listen();
  kj::Vector<kj::Own<kj::AsyncIoStream>> accepted;
  kj::Function<kj::Promise<void>()> serve = [&]() {
    return listener->accept().then([&](kj::Own<kj::AsyncIoStream> stream) {
      auto& s = *stream;
      accepted.add(kj::mv(stream));
      return sendAbort(s).then([&]() { return serve(); });
    });
  };
  auto serving = serve().eagerlyEvaluate(nullptr);
  auto echo = ActorRef<Echo>::connect(loop, kj::str("tcp://127.0.0.1:", listener->getPort()).cStr(),
                                      "echo");
  for (size_t call = 1; call <= 3; ++call) {
    auto e = kj::runCatchingExceptions([&]() { echoBytes(echo, 100).wait(ws()); });
    ASSERT_NE(e, nullptr) << "a call to a server that aborts every connection succeeded";
    EXPECT_EQ(accepted.size(), call)
        << "call " << call << " was sent over the connection the peer had aborted";
  }
}

// Answers with 1024 bytes for every byte it is sent.
class Amplifier final : public Echo::Server {
protected:
  kj::Promise<void> echo(EchoContext context) override {
    size_t size = context.getParams().getPayload().size() * 1024;
    context.getResults().initPayload(size);
    return kj::READY_NOW;
  }
};

TEST_F(BadInputTest, AResponseOverTheServersLimitFailsOnlyThatCall) {
  ActorServer small(loop, JobContext(), {.maxMessageBytes = 1 << 20});
  small.host<Echo>("amplifier", kj::heap<Amplifier>());
  auto amplifier = ActorRef<Echo>::connect(loop, small.listen("tcp://127.0.0.1:0").c_str(),
                                           "amplifier");
  auto ask = [&](size_t size) {
    return amplifier.call([size](Echo::Client c) {
      auto q = c.echoRequest();
      q.initPayload(size);
      return q.send();
    });
  };
  try {
    ask(2048).wait(ws());  // a 2 KiB request, a 2 MiB response
    FAIL() << "a 2 MiB response over the server's 1 MiB limit must fail";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::MESSAGE_TOO_LARGE) << e.getDescription().cStr();
  }
  // The same connection still works.
  EXPECT_EQ(ask(64).wait(ws()).getPayload().size(), 64u * 1024);
}

TEST_F(BadInputTest, ADefaultConnectionCarriesA256MiBPayload) {
  auto echo = ref<Echo>("echo");
  constexpr size_t SIZE = size_t{256} << 20;
  auto r = echoBytes(echo, SIZE).wait(ws());
  ASSERT_EQ(r.getPayload().size(), SIZE);
  EXPECT_EQ(r.getPayload()[4096 * 5], 5);
}

TEST_F(BadInputTest, AClientThatVanishesMidCallHasItsCallCancelled) {
  {
    auto b = ref<Blocker>("blocker");
    auto p = hold(b, "orphan");
    blocker.whenStarted(1).wait(ws());
    // The client and its connection go away with the call in flight.
  }
  blocker.whenCancelled(1).wait(ws());
  EXPECT_EQ(server->callsInFlight(), 0u);
  expectServing();
}

}  // namespace
}  // namespace troupe
