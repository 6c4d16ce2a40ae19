// What peers can make a server hold (ConnectionLimits): connections past the bound closed as
// they come, silent and trickling connections closed at their timeouts, idle ones kept, and the
// bytes of messages still arriving bounded across connections. Raw sockets play the careless or
// hostile peer; a real ActorRef shows that the server still serves. The loop's clock is manual,
// so a timeout ends exactly when the test moves time past it. Memory is this process's resident
// set, printed before and after, with the bound the test holds it to.

#include <string>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "troupe/resolver/registry_server.h"
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

TEST_F(ConnectionLimitsTest, MessagesStillArrivingHoldNoMoreThanTheBudget) {
  // Eight senders each announce a 16 MiB message and send 12 MiB of it: without the budget the
  // server would hold 8 x 16 MiB for them. With 32 MiB, two are read and the others wait.
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
  EXPECT_EQ(server->incompleteMessageBytes(), 32 * MiB);
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
