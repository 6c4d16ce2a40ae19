#include "troupe/actor/event_loop.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/vector.h>

namespace troupe {
namespace {

TEST(EventLoop, TimerFiresNoEarlierThanItsDelay) {
  EventLoop loop;
  auto& timer = loop.timer();
  auto start = timer.now();
  timer.afterDelay(20 * kj::MILLISECONDS).wait(loop.waitScope());
  EXPECT_GE(timer.now() - start, 20 * kj::MILLISECONDS);
}

TEST(EventLoop, TimersFireInDeadlineOrder) {
  EventLoop loop;
  auto& timer = loop.timer();
  kj::Vector<int> order;
  // Eager, so each callback runs when its timer fires rather than when the join is consumed.
  auto a = timer.afterDelay(30 * kj::MILLISECONDS).then([&]() { order.add(30); }).eagerlyEvaluate(nullptr);
  auto b = timer.afterDelay(10 * kj::MILLISECONDS).then([&]() { order.add(10); }).eagerlyEvaluate(nullptr);
  auto c = timer.afterDelay(20 * kj::MILLISECONDS).then([&]() { order.add(20); }).eagerlyEvaluate(nullptr);
  kj::joinPromises(kj::arr(kj::mv(a), kj::mv(b), kj::mv(c))).wait(loop.waitScope());
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], 10);
  EXPECT_EQ(order[1], 20);
  EXPECT_EQ(order[2], 30);
}

TEST(EventLoop, CancelledTimerDoesNotFire) {
  EventLoop loop;
  bool fired = false;
  {
    auto p = loop.timer().afterDelay(5 * kj::MILLISECONDS).then([&]() { fired = true; })
                 .eagerlyEvaluate(nullptr);
  }
  loop.timer().afterDelay(15 * kj::MILLISECONDS).wait(loop.waitScope());
  EXPECT_FALSE(fired);
}

TEST(EventLoop, ATimerDueWhileTheLoopWasBusyStillFires) {
  // The timer comes due while the thread is busy, so libuv finds it expired as soon as it next
  // runs; with nothing else to do, the loop must still wake up for it (before the fix it slept
  // in epoll with no timeout, and this test hung until ctest's timeout).
  EventLoop loop;
  auto& timer = loop.timer();
  int fired = 0;
  for (int i = 0; i < 20; ++i) {
    auto due = timer.now() + 1 * kj::MILLISECONDS;
    auto promise = timer.atTime(due).then([&]() { ++fired; });
    while (timer.now() < due + 2 * kj::MILLISECONDS) {
    }
    promise.wait(loop.waitScope());
    EXPECT_GE(timer.now(), due);
  }
  EXPECT_EQ(fired, 20);
}

TEST(EventLoop, TimeoutRejectsSlowPromise) {
  EventLoop loop;
  auto never = kj::Promise<int>(kj::NEVER_DONE);
  auto result = loop.timer().timeoutAfter(10 * kj::MILLISECONDS, kj::mv(never));
  EXPECT_THROW(result.wait(loop.waitScope()), kj::Exception);
}

TEST(EventLoop, ExecutorRunsWorkFromAnotherThreadOnTheLoop) {
  EventLoop loop;
  const kj::Executor& executor = loop.executor();
  auto loopThread = std::this_thread::get_id();
  auto paf = kj::newPromiseAndFulfiller<std::thread::id>();
  std::thread other([&]() {
    auto ranOn = executor.executeSync([&]() { return std::this_thread::get_id(); });
    EXPECT_EQ(ranOn, loopThread);
    executor.executeSync([&]() { paf.fulfiller->fulfill(std::this_thread::get_id()); });
  });
  auto id = paf.promise.wait(loop.waitScope());
  other.join();
  EXPECT_EQ(id, loopThread);
}

TEST(EventLoop, ExecuteAsyncFromAnotherLoopResolvesThere) {
  EventLoop loop;
  const kj::Executor& executor = loop.executor();
  std::atomic<int> seen{0};
  auto done = kj::newPromiseAndCrossThreadFulfiller<void>();
  auto& fulfiller = *done.fulfiller;
  std::thread other([&]() {
    EventLoop otherLoop;
    auto value = executor.executeAsync([]() { return 41 + 1; }).wait(otherLoop.waitScope());
    seen = value;
    fulfiller.fulfill();
  });
  done.promise.wait(loop.waitScope());
  other.join();
  EXPECT_EQ(seen.load(), 42);
}

TEST(EventLoop, OffloadRunsOnAnotherThreadAndResolvesOnTheLoop) {
  EventLoop loop;
  auto loopThread = std::this_thread::get_id();
  std::thread::id workerThread;
  auto result = loop.offload([&]() {
                      workerThread = std::this_thread::get_id();
                      uint64_t sum = 0;
                      for (uint64_t i = 1; i <= 1000000; ++i) sum += i;
                      return sum;
                    })
                    .wait(loop.waitScope());
  EXPECT_EQ(result, 500000500000u);
  EXPECT_NE(workerThread, loopThread);
}

TEST(EventLoop, OffloadPropagatesExceptions) {
  EventLoop loop;
  auto p = loop.offload([]() -> int { KJ_FAIL_REQUIRE("reduction failed", 7); });
  try {
    p.wait(loop.waitScope());
    FAIL() << "expected an exception";
  } catch (const kj::Exception& e) {
    EXPECT_NE(e.getDescription().findFirst('7'), nullptr) << e.getDescription().cStr();
    EXPECT_EQ(e.getType(), kj::Exception::Type::FAILED);
  }
}

TEST(EventLoop, OffloadVoidAndDroppedWorkLeaveTheLoopClean) {
  std::atomic<int> ran{0};
  {
    EventLoop loop;
    loop.offload([&]() { ran++; }).wait(loop.waitScope());
    EXPECT_EQ(ran.load(), 1);
    // Dropped at once: either cancelled before starting or finished and discarded. The loop's
    // destructor waits for it and must find no handle leaked.
    { auto dropped = loop.offload([&]() { ran++; }); }
  }
  EXPECT_GE(ran.load(), 1);
}

TEST(EventLoop, SignalResolvesWithItsNumber) {
  EventLoop loop;
  auto sig = loop.onSignal({SIGUSR1, SIGUSR2});
  ASSERT_EQ(::kill(::getpid(), SIGUSR2), 0);
  EXPECT_EQ(sig.wait(loop.waitScope()), SIGUSR2);
}

TEST(EventLoop, TcpEchoOverThePort) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  auto addr = loop.network().parseAddress("127.0.0.1", 0).wait(ws);
  auto listener = addr->listen();
  auto port = listener->getPort();
  ASSERT_NE(port, 0u);

  auto server = listener->accept().then([](kj::Own<kj::AsyncIoStream> stream) {
    auto buffer = kj::heapArray<kj::byte>(5);
    auto& s = *stream;
    auto ptr = buffer.begin();
    return s.read(ptr, 5)
        .then([&s, ptr]() { return s.write(ptr, 5); })
        .attach(kj::mv(stream), kj::mv(buffer));
  });

  auto client = loop.network().parseAddress("127.0.0.1", port).wait(ws)->connect().wait(ws);
  client->write("hello", 5).wait(ws);
  char reply[5];
  client->read(reply, 5).wait(ws);
  server.wait(ws);
  EXPECT_EQ(kj::StringPtr(reply, 5), "hello");
}

TEST(EventLoop, UnixSocketLargeTransferAndEof) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  auto path = kj::str("/tmp/troupe-loop-test-", getpid(), ".sock");
  unlink(path.cStr());
  auto listener = loop.network().parseAddress(kj::str("unix:", path)).wait(ws)->listen();

  constexpr size_t SIZE = 8 << 20;  // larger than any socket buffer: forces EAGAIN both ways
  auto data = kj::heapArray<kj::byte>(SIZE);
  for (size_t i = 0; i < SIZE; ++i) data[i] = static_cast<kj::byte>(i * 7);

  auto sender = listener->accept().then([&](kj::Own<kj::AsyncIoStream> stream) {
    auto& s = *stream;
    return s.write(data.begin(), data.size()).then([&s]() { s.shutdownWrite(); }).attach(kj::mv(stream));
  }).eagerlyEvaluate(nullptr);
  auto client = loop.network().parseAddress(kj::str("unix:", path)).wait(ws)->connect().wait(ws);
  auto received = client->readAllBytes().wait(ws);
  sender.wait(ws);
  unlink(path.cStr());
  ASSERT_EQ(received.size(), SIZE);
  EXPECT_EQ(memcmp(received.begin(), data.begin(), SIZE), 0);
}

TEST(EventLoop, ConnectRefusedIsDisconnected) {
  EventLoop loop;
  auto& ws = loop.waitScope();
  // Find a port nobody listens on: bind one, read it back, close it.
  uint port;
  {
    auto l = loop.network().parseAddress("127.0.0.1", 0).wait(ws)->listen();
    port = l->getPort();
  }
  auto addr = loop.network().parseAddress("127.0.0.1", port).wait(ws);
  try {
    addr->connect().wait(ws);
    FAIL() << "connect should fail";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(e.getType(), kj::Exception::Type::DISCONNECTED) << e.getDescription().cStr();
  }
}

TEST(EventLoop, ALoopPerThread) {
  std::atomic<int> done{0};
  auto body = [&]() {
    EventLoop loop;
    loop.timer().afterDelay(2 * kj::MILLISECONDS).wait(loop.waitScope());
    done++;
  };
  std::thread a(body), b(body);
  a.join();
  b.join();
  EXPECT_EQ(done.load(), 2);
}

}  // namespace
}  // namespace troupe
