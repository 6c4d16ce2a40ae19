#include "troupe/base/event_loop.h"

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

// The real clock: the bridge from kj's timers to libuv's. Everything else about timers is
// checked on a manual clock (below), where nothing depends on how busy the machine is.

TEST(EventLoop, TimerFiresNoEarlierThanItsDelay) {
  EventLoop loop;
  auto& timer = loop.timer();
  auto start = timer.now();
  timer.afterDelay(20 * kj::MILLISECONDS).wait(loop.waitScope());
  EXPECT_GE(timer.now() - start, 20 * kj::MILLISECONDS);
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
    {
      auto dropped = loop.offload([&]() { ran++; });
    }
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

  auto sender = listener->accept()
                    .then([&](kj::Own<kj::AsyncIoStream> stream) {
                      auto& s = *stream;
                      return s.write(data.begin(), data.size())
                          .then([&s]() { s.shutdownWrite(); })
                          .attach(kj::mv(stream));
                    })
                    .eagerlyEvaluate(nullptr);
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

TEST(EventLoop, ALoopPerThreadEachWithItsOwnClock) {
  std::atomic<int> done{0};
  auto body = [&](kj::Duration step) {
    EventLoop loop({.manualClock = true});
    auto start = loop.timer().now();
    auto fired = loop.timer().afterDelay(2 * kj::MILLISECONDS);
    loop.advanceTime(step);
    fired.wait(loop.waitScope());
    EXPECT_EQ(loop.timer().now() - start, step);
    done++;
  };
  std::thread a(body, 2 * kj::MILLISECONDS), b(body, 5 * kj::MILLISECONDS);
  a.join();
  b.join();
  EXPECT_EQ(done.load(), 2);
}

// ---------------------------------------------------------------------------------------------
// The manual clock

// Records the order in which timers fired.
struct Fired {
  kj::Vector<int> order;
  kj::String str() const { return kj::strArray(order, ","); }
};

kj::Promise<void> record(kj::Promise<void> timer, Fired& fired, int tag) {
  // Eager, so it runs when the timer fires rather than when someone waits on it.
  return timer.then([&fired, tag]() { fired.order.add(tag); }).eagerlyEvaluate(nullptr);
}

TEST(EventLoopManualClock, TimersFireOnlyWhenTheClockIsAdvancedInOrderAndNeverEarly) {
  EventLoop loop({.manualClock = true});
  auto& ws = loop.waitScope();
  auto& timer = loop.timer();
  auto start = timer.now();
  Fired fired;
  auto a = record(timer.afterDelay(30 * kj::MILLISECONDS), fired, 30);
  auto b = record(timer.afterDelay(10 * kj::MILLISECONDS), fired, 10);
  auto c = record(timer.atTime(start + 20 * kj::MILLISECONDS), fired, 20);
  auto d = record(timer.afterDelay(10 * kj::MILLISECONDS), fired, 11);  // due with b, set after it

  ws.poll();
  EXPECT_EQ(timer.now(), start);  // running the loop does not move the clock
  EXPECT_EQ(fired.str(), "");

  loop.advanceTime(10 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  ws.poll();
  EXPECT_EQ(fired.str(), "");
  loop.advanceTime(1 * kj::NANOSECONDS);
  EXPECT_EQ(fired.str(), "");  // fired, but continuations run when the loop next runs
  ws.poll();
  EXPECT_EQ(fired.str(), "10,11");
  EXPECT_EQ(timer.now(), start + 10 * kj::MILLISECONDS);

  // One step past both: each fires once, earliest first.
  loop.advanceTime(1 * kj::SECONDS);
  ws.poll();
  EXPECT_EQ(fired.str(), "10,11,20,30");
  EXPECT_EQ(timer.now(), start + 1010 * kj::MILLISECONDS);
}

TEST(EventLoopManualClock, ATimerWhoseTimeHasComeResolvesWithoutAnAdvance) {
  EventLoop loop({.manualClock = true});
  auto& timer = loop.timer();
  timer.afterDelay(0 * kj::SECONDS).wait(loop.waitScope());
  loop.advanceTime(5 * kj::MILLISECONDS);
  timer.atTime(timer.now() - 1 * kj::MILLISECONDS).wait(loop.waitScope());
  timer.atTime(timer.now()).wait(loop.waitScope());
}

TEST(EventLoopManualClock, ACancelledTimerDoesNotFire) {
  EventLoop loop({.manualClock = true});
  Fired fired;
  { auto dropped = record(loop.timer().afterDelay(5 * kj::MILLISECONDS), fired, 5); }
  auto kept = record(loop.timer().afterDelay(15 * kj::MILLISECONDS), fired, 15);
  loop.advanceTime(15 * kj::MILLISECONDS);
  kept.wait(loop.waitScope());
  EXPECT_EQ(fired.str(), "15");
}

TEST(EventLoopManualClock, ATimeoutRejectsAPromiseThatIsTooSlow) {
  EventLoop loop({.manualClock = true});
  auto result = loop.timer().timeoutAfter(10 * kj::MILLISECONDS, kj::Promise<int>(kj::NEVER_DONE));
  loop.advanceTime(10 * kj::MILLISECONDS);
  try {
    result.wait(loop.waitScope());
    FAIL() << "the timeout should have rejected it";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(e.getType(), kj::Exception::Type::OVERLOADED) << e.getDescription().cStr();
  }
}

TEST(EventLoopManualClock, ADeadlineOnRealIoFiresWhenTheClockReachesIt) {
  EventLoop loop({.manualClock = true});
  auto& ws = loop.waitScope();
  auto listener = loop.network().parseAddress("127.0.0.1", 0).wait(ws)->listen();
  auto accepted = listener->accept();
  auto client =
      loop.network().parseAddress("127.0.0.1", listener->getPort()).wait(ws)->connect().wait(ws);
  auto server = accepted.wait(ws);

  // Real I/O works as on any loop, without the clock moving.
  client->write("ping", 4).wait(ws);
  char got[4];
  server->read(got, 4).wait(ws);
  EXPECT_EQ(kj::StringPtr(got, 4), "ping");

  // A read nobody answers, bounded by the loop's clock.
  char reply[1];
  auto bounded = loop.timer().timeoutAfter(100 * kj::MILLISECONDS, client->read(reply, 1));
  loop.advanceTime(99 * kj::MILLISECONDS);
  EXPECT_FALSE(bounded.poll(ws));
  loop.advanceTime(1 * kj::MILLISECONDS);
  ASSERT_TRUE(bounded.poll(ws));
  try {
    bounded.wait(ws);
    FAIL() << "the read should have timed out";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(e.getType(), kj::Exception::Type::OVERLOADED) << e.getDescription().cStr();
  }
  // The connection is still good.
  server->write("p", 1).wait(ws);
  client->read(reply, 1).wait(ws);
  EXPECT_EQ(reply[0], 'p');
}

TEST(EventLoopManualClock, CalendarTimeStartsAtTheRealTimeAndMovesWithTheClock) {
  auto before = kj::systemPreciseCalendarClock().now();
  EventLoop loop({.manualClock = true});
  auto after = kj::systemPreciseCalendarClock().now();
  auto start = loop.calendarNow();
  EXPECT_GE(start, before);
  EXPECT_LE(start, after);

  loop.timer().afterDelay(0 * kj::SECONDS).wait(loop.waitScope());
  EXPECT_EQ(loop.calendarNow(), start);  // running the loop does not move it

  auto monotonic = loop.timer().now();
  loop.advanceTime(90 * kj::MINUTES);
  EXPECT_EQ(loop.calendarNow() - start, 90 * kj::MINUTES);
  EXPECT_EQ(loop.timer().now() - monotonic, 90 * kj::MINUTES);
}

TEST(EventLoopManualClock, ARealClockRefusesToBeAdvancedAndKeepsTheSystemsCalendar) {
  EventLoop real;
  EXPECT_FALSE(real.hasManualClock());
  EXPECT_THROW(real.advanceTime(1 * kj::SECONDS), kj::Exception);
  auto before = kj::systemPreciseCalendarClock().now();
  auto now = real.calendarNow();
  EXPECT_GE(now, before);
  EXPECT_LE(now, kj::systemPreciseCalendarClock().now());
}

TEST(EventLoopManualClock, TimeCannotGoBackwards) {
  EventLoop loop({.manualClock = true});
  EXPECT_TRUE(loop.hasManualClock());
  auto start = loop.timer().now();
  EXPECT_THROW(loop.advanceTime(-1 * kj::MILLISECONDS), kj::Exception);
  EXPECT_EQ(loop.timer().now(), start);
}

}  // namespace
}  // namespace troupe
