// What peers can make a server hold (ConnectionLimits): connections past the bound closed as
// they come, silent and trickling connections closed at their timeouts (waiting for the budget
// or not), idle ones kept, and the bytes of messages still arriving bounded across connections
// and shared, so that hoarders keep no one else's call waiting. Raw sockets play the careless or
// hostile peer; a real ActorRef shows that the server still serves. The loop's clock is manual,
// so a timeout ends exactly when the test moves time past it. Memory is this process's resident
// set, printed before and after, with the bound the test holds it to.

#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "troupe/net/rpc_acceptor.h"
#include "troupe/net/segment_placement.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/manual_clock.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/resident_memory.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::Echo;

constexpr uint64_t MiB = uint64_t{1} << 20;

class ConnectionLimitsTest : public ::testing::Test {
protected:
  ConnectionLimitsTest()
      : loop(EventLoopOptions{.manualClock = true}), sink(std::make_shared<test::LineSink>()) {}
  ~ConnectionLimitsTest() noexcept override {}

  void start(ConnectionLimits limits = {}) {
    JobContext job;
    job.jobId = "job-1";
    job.taskIndex = 0;
    job.numTasks = 1;
    server = kj::heap<ActorServer>(
        loop, job, ActorServerOptions{.logger = test::loggerFor(sink), .connections = limits});
    server->host<Echo>("echo", kj::heap<test::EchoImpl>());
    address = server->listen("tcp://127.0.0.1:0");
  }

  kj::WaitScope& ws() { return loop.waitScope(); }

  kj::Own<kj::AsyncIoStream> raw() {
    auto a = Address::parse(address.c_str());
    return loop.network().parseAddress(a.toKjAddress()).wait(ws())->connect().wait(ws());
  }

  // Polls the loop until `done()` holds; false if it never does. The peers are on this loop and
  // loopback delivers at once, so what was sent is processed within a few polls.
  template <typename Fn>
  bool pollUntil(Fn&& done) {
    for (int i = 0; i < 2000; ++i) {
      if (done()) return true;
      ws().poll();
    }
    return done();
  }

  // Whether the server has closed `stream` (reads reach its end, after whatever it said last,
  // a Cap'n Proto Abort say), after polling the loop.
  bool closedByServer(kj::AsyncIoStream& stream) {
    auto rest = stream.readAllBytes(64 * 1024);
    for (int i = 0; i < 50; ++i) {
      if (rest.poll(ws())) return true;
    }
    return false;
  }

  // A raw connection that announces a message of `bytes` (one segment) and sends `sent` bytes of
  // its body from `chunk`, as far as the server reads them (`writes` keeps the writing).
  kj::Own<kj::AsyncIoStream> announce(uint64_t bytes, uint64_t sent = 0,
                                      kj::ArrayPtr<const kj::byte> chunk = nullptr,
                                      kj::Vector<kj::Promise<void>>* writes = nullptr);

  // An echo of `bytes` on `echo`, with a 15 s deadline: the payload that came back, or null if it
  // has not come back within 15 s of real time (the loop's clock does not move meanwhile).
  kj::Maybe<kj::Array<kj::byte>> echoWithin15s(ActorRef<Echo>& echo, size_t bytes);

  double metric(kj::StringPtr name, MetricLabels labels = {}) {
    return server->metrics().sum(name, labels);
  }

  // One echo round trip on a fresh connection: the server still serves.
  void expectServing() {
    auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo");
    auto r = echo.call([](Echo::Client c) {
                   auto q = c.echoRequest();
                   q.setPayload(kj::StringPtr("still here").asBytes());
                   return q.send();
                 })
                 .wait(ws());
    EXPECT_EQ(r.getPayload().size(), 10u);
  }

  EventLoop loop;
  std::shared_ptr<test::LineSink> sink;
  kj::Own<ActorServer> server;
  std::string address;
};

TEST_F(ConnectionLimitsTest, ConnectionsPastTheBoundAreClosedAsTheyComeAndCostNothing) {
  start({.maxConnections = 100});
  kj::Vector<kj::Own<kj::AsyncIoStream>> held;
  uint64_t before = test::residentBytes();
  for (int i = 0; i < 100; ++i) held.add(raw());
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 100; }));
  uint64_t within = test::residentBytes();
  for (int i = 0; i < 100; ++i) {
    auto refused = raw();
    EXPECT_TRUE(closedByServer(*refused)) << "connection " << 101 + i << " was kept";
  }
  uint64_t past = test::residentBytes();
  EXPECT_EQ(server->connectionCount(), 100u);
  std::printf("100 idle connections: %llu KiB before, %llu KiB with them, %llu KiB after 100 "
              "more were refused\n",
              static_cast<unsigned long long>(before >> 10),
              static_cast<unsigned long long>(within >> 10),
              static_cast<unsigned long long>(past >> 10));
  // Both ends are in this process: 64 KiB a connection bounds the server's share and ours.
  EXPECT_LT(within - before, 100 * 64 * 1024);
  EXPECT_EQ(sink->count("ConnectionLimits::maxConnections"), 1u);  // once a second at most

  // A place frees: a client gets in again.
  held.removeLast();
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 99; }));
  expectServing();
}

TEST_F(ConnectionLimitsTest, AConnectionThatSendsNothingIsClosedAtTheFirstMessageTimeout) {
  start();  // 10 s
  auto silent = raw();
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 1; }));
  loop.advanceTime(10 * kj::SECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(closedByServer(*silent));
  loop.advanceTime(1 * kj::NANOSECONDS);
  EXPECT_TRUE(closedByServer(*silent));
  EXPECT_EQ(sink->count("no whole message arrived within 10000 ms of connecting"), 1u);
  expectServing();
}

TEST_F(ConnectionLimitsTest, ATricklingSenderIsClosedAtTheMessageTimeout) {
  start({.firstMessageTimeout = 100 * kj::SECONDS, .messageTimeout = 5 * kj::SECONDS});
  auto slow = raw();
  uint32_t header[2] = {0, 1000};  // one segment of 1000 words
  slow->write(header, sizeof(header)).wait(ws());
  EXPECT_FALSE(closedByServer(*slow));  // and the server has read the header
  // One byte a second: always progressing, never done.
  for (int second = 1; second < 5; ++second) {
    loop.advanceTime(1 * kj::SECONDS);
    slow->write("x", 1).wait(ws());
    EXPECT_FALSE(closedByServer(*slow)) << "closed after " << second << " s";
  }
  loop.advanceTime(1 * kj::SECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(closedByServer(*slow));
  loop.advanceTime(1 * kj::NANOSECONDS);
  EXPECT_TRUE(closedByServer(*slow));
  EXPECT_EQ(sink->count("a message was still incomplete 5000 ms after it began"), 1u);
  expectServing();
}

TEST_F(ConnectionLimitsTest, AnIdleConnectionBetweenMessagesIsKept) {
  start();
  auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo");
  auto call = [&]() {
    return echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  };
  call();
  uint64_t epoch = echo.channel().epoch();
  loop.advanceTime(1 * kj::HOURS);
  ws().poll();
  call();
  EXPECT_EQ(echo.channel().epoch(), epoch) << "the connection was closed while idle";
  EXPECT_EQ(server->connectionCount(), 1u);
}

// Writes `bytes` of body to `stream`, 1 MiB at a time, from one buffer.
kj::Promise<void> sendBody(kj::AsyncIoStream& stream, kj::ArrayPtr<const kj::byte> chunk,
                           uint64_t bytes) {
  if (bytes == 0) return kj::READY_NOW;
  size_t n = std::min<uint64_t>(bytes, chunk.size());
  return stream.write(chunk.begin(), n).then([&stream, chunk, bytes, n]() {
    return sendBody(stream, chunk, bytes - n);
  });
}

kj::Own<kj::AsyncIoStream> ConnectionLimitsTest::announce(uint64_t bytes, uint64_t sent,
                                                          kj::ArrayPtr<const kj::byte> chunk,
                                                          kj::Vector<kj::Promise<void>>* writes) {
  auto stream = raw();
  uint32_t header[2] = {0, static_cast<uint32_t>(bytes / sizeof(capnp::word))};
  stream->write(header, sizeof(header)).wait(ws());
  if (sent > 0) {
    writes->add(
        sendBody(*stream, chunk, sent).catch_([](kj::Exception&&) {}).eagerlyEvaluate(nullptr));
  }
  return stream;
}

kj::Maybe<kj::Array<kj::byte>> ConnectionLimitsTest::echoWithin15s(ActorRef<Echo>& echo,
                                                                   size_t bytes) {
  using Result = kj::Maybe<kj::Array<kj::byte>>;
  auto call = echo.call(
      [bytes](Echo::Client c) {
        auto q = c.echoRequest(capnp::MessageSize{bytes / sizeof(capnp::word) + 16, 0});
        auto data = q.initPayload(bytes);
        for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<kj::byte>(i % 251);
        return q.send();
      },
      {.deadline = 15 * kj::SECONDS});
  return call
      .then([](capnp::Response<Echo::EchoResults>&& r) -> Result {
        return kj::heapArray(r.getPayload());
      })
      .exclusiveJoin(
          test::afterRealTime(loop, 15 * kj::SECONDS).then([]() -> Result { return nullptr; }))
      .wait(ws());
}

// Whether `payload` is what echoWithin15s() sent.
bool isEchoed(kj::ArrayPtr<const kj::byte> payload, size_t bytes) {
  if (payload.size() != bytes) return false;
  for (size_t i = 0; i < bytes; ++i) {
    if (payload[i] != static_cast<kj::byte>(i % 251)) return false;
  }
  return true;
}

TEST_F(ConnectionLimitsTest, TwentyPeersThatAnnounce500MiBAndSendNothingKeepNoCallWaiting) {
  // As it was found: twenty connections each announce a 500 MiB message and send nothing more,
  // and a well-behaved client makes a 1 MiB call on a fresh connection with a 15 s deadline.
  start();  // 1 GiB budget, 10 s for a first message
  kj::Vector<kj::Own<kj::AsyncIoStream>> hoarders;
  for (int i = 0; i < 20; ++i) hoarders.add(announce(500 * MiB));
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 20; }));
  for (int i = 0; i < 50; ++i) ws().poll();  // the server has read every header
  EXPECT_EQ(server->incompleteMessageBytes(), 0u) << "a peer that sent no body holds budget";

  auto began = loop.timer().now();
  auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo");
  KJ_IF_MAYBE(payload, echoWithin15s(echo, MiB)) {
    EXPECT_TRUE(isEchoed(*payload, MiB));
  } else {
    FAIL() << "the 1 MiB call waited past its 15 s deadline behind twenty hoarders";
  }
  // It waited for no timeout: the loop's clock has not moved, and the hoarders are still there.
  EXPECT_EQ(loop.timer().now(), began);
  EXPECT_EQ(server->connectionCount(), 21u);

  // The hoarders go at the first-message timeout, counted and logged as such.
  loop.advanceTime(10 * kj::SECONDS - 1 * kj::NANOSECONDS);
  for (auto& h : hoarders) EXPECT_FALSE(closedByServer(*h));
  loop.advanceTime(1 * kj::NANOSECONDS);
  for (auto& h : hoarders) EXPECT_TRUE(closedByServer(*h));
  EXPECT_EQ(sink->count("no whole message arrived within 10000 ms of connecting "
                        "(ConnectionLimits::firstMessageTimeout), with 0 of the 524288000 bytes "
                        "of a message in; closing it"),
            20u);
  EXPECT_EQ(metric("troupe_connections_timed_out_total", {{"timeout", "first_message"}}), 20);
  EXPECT_EQ(metric("troupe_connections_timed_out_total", {{"timeout", "message"}}), 0);
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 1; }));
  EXPECT_EQ(server->incompleteMessageBytes(), 0u);
  expectServing();
}

TEST_F(ConnectionLimitsTest, PeersThatStallAfterSomeBytesHoldWhatTheySentAndCloseOnTime) {
  // Twenty connections each announce 500 MiB and send 2 MiB of it. The first is let in whole;
  // those read in steps hold what they sent plus a step, while each could still complete from
  // what is free; the rest wait for the budget. Either way each goes at its first-message
  // timeout, and a 1 MiB call gets through at once.
  start();
  auto chunk = kj::heapArray<kj::byte>(MiB);
  memset(chunk.begin(), 0, chunk.size());
  kj::Vector<kj::Promise<void>> writes;
  kj::Vector<kj::Own<kj::AsyncIoStream>> hoarders;
  for (int i = 0; i < 20; ++i) hoarders.add(announce(500 * MiB, 2 * MiB, chunk, &writes));
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 20; }));
  for (int i = 0; i < 50; ++i) ws().poll();
  uint64_t held = server->incompleteMessageBytes();
  double waiting = metric("troupe_incomplete_messages_waiting");
  std::printf("twenty peers stalled after 2 MiB of 500: %llu MiB of the budget held, %d waiting\n",
              static_cast<unsigned long long>(held / MiB), static_cast<int>(waiting));
  // One whole (500 MiB), each of the others let in at most 3 MiB.
  EXPECT_GE(held, 500 * MiB);
  EXPECT_LE(held, 500 * MiB + 19 * 3 * MiB);
  EXPECT_GT(waiting, 0);
  EXPECT_LT(waiting, 19);

  auto began = loop.timer().now();
  auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo");
  KJ_IF_MAYBE(payload, echoWithin15s(echo, MiB)) {
    EXPECT_TRUE(isEchoed(*payload, MiB));
  } else {
    FAIL() << "the 1 MiB call waited past its 15 s deadline behind twenty stalled peers";
  }
  EXPECT_EQ(loop.timer().now(), began);

  loop.advanceTime(10 * kj::SECONDS - 1 * kj::NANOSECONDS);
  for (auto& h : hoarders) EXPECT_FALSE(closedByServer(*h));
  loop.advanceTime(1 * kj::NANOSECONDS);
  for (auto& h : hoarders) EXPECT_TRUE(closedByServer(*h));
  EXPECT_EQ(sink->count("no whole message arrived within 10000 ms of connecting"), 20u);
  // Those that waited say so.
  EXPECT_EQ(sink->count("bytes of a message in, waiting for its share of the budget"),
            static_cast<size_t>(waiting));
  EXPECT_EQ(metric("troupe_connections_timed_out_total", {{"timeout", "first_message"}}), 20);
  writes.clear();
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 1; }));
  EXPECT_EQ(server->incompleteMessageBytes(), 0u);
  EXPECT_EQ(metric("troupe_incomplete_messages_waiting"), 0);
}

TEST_F(ConnectionLimitsTest, AMessageWaitingForTheBudgetIsClosedAtTheMessageTimeout) {
  // A client's second message (its first, the bootstrap, came whole) waits for the budget
  // behind two stalled peers, one after the other, longer than the message timeout allows.
  start({.maxIncompleteMessageBytes = 8 * MiB,
         .firstMessageTimeout = 100 * kj::SECONDS,
         .messageTimeout = 5 * kj::SECONDS});
  auto chunk = kj::heapArray<kj::byte>(MiB);
  memset(chunk.begin(), 0, chunk.size());
  kj::Vector<kj::Promise<void>> writes;
  // t = 0: 4 MiB announced, 3 MiB sent: let in whole, alone. Its deadline is t = 5.
  auto first = announce(4 * MiB, 3 * MiB, chunk, &writes);
  ASSERT_TRUE(pollUntil([&]() { return server->incompleteMessageBytes() == 4 * MiB; }));

  // t = 1: a 6 MiB call cannot complete from the 4 MiB free, and waits. Its deadline is t = 6.
  loop.advanceTime(1 * kj::SECONDS);
  auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo");
  echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  auto call = echo.call([](Echo::Client c) {
    auto q = c.echoRequest(capnp::MessageSize{6 * MiB / sizeof(capnp::word) + 16, 0});
    q.initPayload(6 * MiB);
    return q.send();
  });
  ASSERT_TRUE(pollUntil([&]() { return metric("troupe_incomplete_messages_waiting") == 1; }));

  // t = 4: another 4 MiB, 3 sent: it can complete from what is free, and takes it in steps.
  loop.advanceTime(3 * kj::SECONDS);
  auto second = announce(4 * MiB, 3 * MiB, chunk, &writes);
  ASSERT_TRUE(pollUntil([&]() { return server->incompleteMessageBytes() == 8 * MiB; }));

  // t = 5: the first goes; the 4 MiB it frees are still too few for the call.
  loop.advanceTime(1 * kj::SECONDS);
  EXPECT_TRUE(closedByServer(*first));
  EXPECT_EQ(server->incompleteMessageBytes(), 4 * MiB);
  EXPECT_FALSE(call.poll(ws()));

  // t = 6: the call's connection goes at its message timeout, counted and logged with its wait.
  loop.advanceTime(1 * kj::SECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(call.poll(ws()));
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(pollUntil([&]() { return call.poll(ws()); }));
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { call.wait(ws()); })) {
    EXPECT_EQ(e->getType(), kj::Exception::Type::DISCONNECTED) << e->getDescription().cStr();
  } else {
    ADD_FAILURE() << "the call went through";
  }
  EXPECT_EQ(sink->count("a message was still incomplete 5000 ms after it began "
                        "(ConnectionLimits::messageTimeout), with "),
            2u);  // the first peer's, and the call's
  EXPECT_EQ(sink->count(" bytes of a message in, waiting for its share of the budget for "
                        "incomplete messages; closing it"),
            1u);
  EXPECT_EQ(metric("troupe_connections_timed_out_total", {{"timeout", "message"}}), 2);
  EXPECT_EQ(metric("troupe_connections_timed_out_total", {{"timeout", "first_message"}}), 0);

  // t = 9: the second goes too, and everything it held comes back.
  loop.advanceTime(3 * kj::SECONDS);
  EXPECT_TRUE(closedByServer(*second));
  writes.clear();
  EXPECT_EQ(server->incompleteMessageBytes(), 0u);
  expectServing();
}

TEST_F(ConnectionLimitsTest, LargeMessagesArrivingTogetherShareTheBudgetAndArriveIntact) {
  // Four 24 MiB calls at once with a 64 MiB budget: one let in whole, the others read in steps
  // or waiting their turn; every byte comes back.
  start({.maxIncompleteMessageBytes = 64 * MiB});
  kj::Vector<ActorRef<Echo>> refs;
  for (int i = 0; i < 4; ++i) refs.add(ActorRef<Echo>::connect(loop, address.c_str(), "echo"));
  for (auto& r : refs) r.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  constexpr size_t SIZE = 24 * MiB;
  kj::Vector<kj::Promise<bool>> calls;
  for (auto& r : refs) {
    calls.add(r.call([](Echo::Client c) {
                 auto q = c.echoRequest(capnp::MessageSize{SIZE / sizeof(capnp::word) + 16, 0});
                 auto data = q.initPayload(SIZE);
                 for (size_t i = 0; i < SIZE; ++i) data[i] = static_cast<kj::byte>(i % 251);
                 return q.send();
               }).then([](capnp::Response<Echo::EchoResults>&& r) {
      return isEchoed(r.getPayload(), SIZE);
    }));
  }
  for (auto& ok : kj::joinPromises(calls.releaseAsArray()).wait(ws())) EXPECT_TRUE(ok);
  EXPECT_EQ(server->incompleteMessageBytes(), 0u);
}

TEST_F(ConnectionLimitsTest, MessagesStillArrivingHoldNoMoreThanTheBudget) {
  // Eight senders each announce a 16 MiB message and send 12 MiB of it: without the budget the
  // server would hold 8 x 16 MiB for them. With 32 MiB, two are read (the first let in whole,
  // the second in steps, as what is free lets it complete) and the others wait.
  start({.maxIncompleteMessageBytes = 32 * MiB});
  auto chunk = kj::heapArray<kj::byte>(MiB);
  memset(chunk.begin(), 0, chunk.size());
  uint64_t before = test::residentBytes();
  uint64_t virtualBefore = test::virtualBytes();
  kj::Vector<kj::Own<kj::AsyncIoStream>> senders;
  kj::Vector<kj::Promise<void>> writes;
  for (int i = 0; i < 8; ++i) {
    senders.add(raw());
    uint32_t header[2] = {0, static_cast<uint32_t>(16 * MiB / sizeof(capnp::word))};
    senders.back()->write(header, sizeof(header)).wait(ws());
    writes.add(sendBody(*senders.back(), chunk, 12 * MiB).eagerlyEvaluate(nullptr));
  }
  // Two senders get all 12 MiB in; the others stop when the socket buffers are full.
  ASSERT_TRUE(pollUntil([&]() {
    size_t done = 0;
    for (auto& w : writes) done += w.poll(ws());
    return done == 2;
  }));
  for (int i = 0; i < 50; ++i) ws().poll();
  uint64_t during = test::residentBytes();
  uint64_t virtualDuring = test::virtualBytes();
  // The first holds its 16 MiB, the second the 12 MiB it sent and a step.
  EXPECT_EQ(server->incompleteMessageBytes(), 29 * MiB);
  size_t finished = 0;
  for (auto& w : writes) finished += w.poll(ws());
  EXPECT_EQ(finished, 2u) << "a sender past the budget was read";
  std::printf("8 senders of 12 MiB each: %llu MiB resident before, %llu MiB while they send; "
              "%llu MiB virtual before, %llu MiB while they send\n",
              static_cast<unsigned long long>(before / MiB),
              static_cast<unsigned long long>(during / MiB),
              static_cast<unsigned long long>(virtualBefore / MiB),
              static_cast<unsigned long long>(virtualDuring / MiB));
  // The two being read hold 24 MiB they have sent; the rest is socket buffers and the chunk.
  EXPECT_LT(during - before, 56 * MiB);
  // Allocated: the two messages' 32 MiB, not eight's 128 MiB.
  EXPECT_LT(static_cast<int64_t>(virtualDuring) - static_cast<int64_t>(virtualBefore),
            static_cast<int64_t>(64 * MiB));

  // The senders go, mid-message: every byte comes back, and the server serves.
  writes.clear();
  senders.clear();
  ASSERT_TRUE(pollUntil([&]() { return server->connectionCount() == 0; }));
  EXPECT_EQ(server->incompleteMessageBytes(), 0u);
  std::printf("after they went: %llu MiB\n",
              static_cast<unsigned long long>(test::residentBytes() / MiB));
  expectServing();
}

// Takes the large last segment of every message into memory of its own and checks, as each
// message lets go of it, that it holds the byte pattern of isEchoed().
class CheckingPlacement final : public SegmentPlacement {
public:
  kj::Maybe<kj::Array<capnp::word>> place(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>,
                                          size_t lastWords) override {
    ++placed;
    return kj::Array<capnp::word>(new capnp::word[lastWords], lastWords, checker);
  }

  size_t placed = 0;
  size_t released() const { return checker.released; }
  size_t intact() const { return checker.intact; }

private:
  class Checker final : public kj::ArrayDisposer {
  public:
    mutable size_t released = 0;
    mutable size_t intact = 0;

  private:
    void disposeImpl(void* first, size_t elementSize, size_t count, size_t,
                     void (*)(void*)) const override {
      ++released;
      intact += isEchoed(kj::arrayPtr(static_cast<const kj::byte*>(first), elementSize * count),
                         elementSize * count);
      delete[] static_cast<capnp::word*>(first);
    }
  };
  Checker checker;
};

TEST_F(ConnectionLimitsTest, ALastSegmentReadInStepsLandsInThePlaceItWasGiven) {
  // Two peers send a message of a one-word segment and a 3 MiB one, the second while the first
  // is still arriving. With 8 MiB the first is let in whole; the second would take the messages
  // let in whole past half of it, so it is read in steps, into the memory its placement gave.
  CheckingPlacement placement;
  RpcAcceptor acceptor(loop, kj::heap<test::EchoImpl>(), DEFAULT_MAX_MESSAGE_BYTES,
                       test::loggerFor(sink), "placing server", nullptr,
                       {.maxIncompleteMessageBytes = 8 * MiB});
  acceptor.placeSegmentsWith(placement);
  address = acceptor.listen("tcp://127.0.0.1:0").toString();
  constexpr size_t LAST = 3 * MiB;
  auto frame = kj::heapArray<kj::byte>(16 + 8 + LAST);
  uint32_t table[4] = {1, 1, LAST / sizeof(capnp::word), 0};
  memcpy(frame.begin(), table, sizeof(table));
  memset(frame.begin() + 16, 0, 8);  // a null root: the RPC system refuses it once it is read
  for (size_t i = 0; i < LAST; ++i) frame[24 + i] = static_cast<kj::byte>(i % 251);
  constexpr size_t PART = 24 + 3 * MiB / 2;  // the head and half the last segment

  auto first = raw();
  first->write(frame.begin(), PART).wait(ws());
  ASSERT_TRUE(pollUntil([&]() { return acceptor.incompleteMessageBytes() == 8 + LAST; }));
  auto second = raw();
  second->write(frame.begin(), PART).wait(ws());
  // The second holds its steps of 1 MiB as far as what it sent: two of them.
  ASSERT_TRUE(pollUntil([&]() { return acceptor.incompleteMessageBytes() == 8 + LAST + 2 * MiB; }));
  second->write(frame.begin() + PART, frame.size() - PART).wait(ws());
  first->write(frame.begin() + PART, frame.size() - PART).wait(ws());
  ASSERT_TRUE(pollUntil([&]() { return placement.released() == 2; }));
  EXPECT_EQ(placement.placed, 2u);
  EXPECT_EQ(placement.intact(), 2u);
  EXPECT_EQ(acceptor.incompleteMessageBytes(), 0u);
}

TEST_F(ConnectionLimitsTest, TheRegistryHoldsNoMoreThanItsBudgetForMessagesArriving) {
  // Sixteen clients each announce a 16 MiB message (under the registry's 64 MiB limit) and send
  // 12 MiB of it; with a 32 MiB budget the registry reads two.
  RegistryServer registry(loop, {.logger = test::loggerFor(sink),
                                 .connections = {.maxIncompleteMessageBytes = 32 * MiB}});
  auto bound = registry.listen("tcp://127.0.0.1:0");
  auto chunk = kj::heapArray<kj::byte>(MiB);
  memset(chunk.begin(), 0, chunk.size());
  uint64_t before = test::residentBytes();
  uint64_t virtualBefore = test::virtualBytes();
  auto a = Address::parse(bound.c_str());
  kj::Vector<kj::Own<kj::AsyncIoStream>> senders;
  kj::Vector<kj::Promise<void>> writes;
  for (int i = 0; i < 16; ++i) {
    senders.add(loop.network().parseAddress(a.toKjAddress()).wait(ws())->connect().wait(ws()));
    uint32_t header[2] = {0, static_cast<uint32_t>(16 * MiB / sizeof(capnp::word))};
    senders.back()->write(header, sizeof(header)).wait(ws());
    writes.add(sendBody(*senders.back(), chunk, 12 * MiB).eagerlyEvaluate(nullptr));
  }
  auto finished = [&]() {
    size_t done = 0;
    for (auto& w : writes) done += w.poll(ws());
    return done;
  };
  ASSERT_TRUE(pollUntil([&]() { return finished() == 2; }));
  for (int i = 0; i < 50; ++i) ws().poll();
  EXPECT_EQ(finished(), 2u) << "a sender past the budget was read";
  uint64_t during = test::residentBytes();
  uint64_t virtualDuring = test::virtualBytes();
  std::printf("registry, 16 senders of 12 MiB each: %llu MiB resident before, %llu MiB while "
              "they send; %llu MiB virtual before, %llu MiB while they send\n",
              static_cast<unsigned long long>(before / MiB),
              static_cast<unsigned long long>(during / MiB),
              static_cast<unsigned long long>(virtualBefore / MiB),
              static_cast<unsigned long long>(virtualDuring / MiB));
  if (!test::MEMORY_IS_SANITIZED) {
    EXPECT_LT(static_cast<int64_t>(during) - static_cast<int64_t>(before),
              static_cast<int64_t>(64 * MiB));
  }
  writes.clear();
  senders.clear();
  ASSERT_TRUE(pollUntil([&]() { return registry.connectionCount() == 0; }));
}

}  // namespace
}  // namespace troupe
