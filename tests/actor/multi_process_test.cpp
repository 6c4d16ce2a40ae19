// Calls between processes: the server is tests/support/test_server_main.cpp in a child process.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/base/errors.h"
#include "tests/support/child_process.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_server.h"

namespace troupe {
namespace {

using test::Blocker;
using test::Calculator;
using test::Echo;

kj::Promise<capnp::Response<Echo::WhoamiResults>> whoami(ActorRef<Echo>& echo) {
  return echo.call([](Echo::Client c) { return c.whoamiRequest().send(); });
}

std::string socketPath(const char* name) {
  return "/tmp/troupe-test-" + std::to_string(getpid()) + "-" + name + ".sock";
}

TEST(MultiProcess, CallsReachAnotherProcess) {
  test::TestServer server;
  EventLoop loop;
  auto calc = ActorRef<Calculator>::connect(loop, server.address.c_str(), "calc");
  auto r = calc.call([](Calculator::Client c) {
                 auto q = c.addRequest();
                 q.setA(1);
                 q.setB(2);
                 return q.send();
               })
               .wait(loop.waitScope());
  EXPECT_EQ(r.getSum(), 3);

  auto echo = ActorRef<Echo>(calc.channel().addRef(), "echo");
  auto who = whoami(echo).wait(loop.waitScope());
  EXPECT_EQ(who.getPid(), static_cast<uint32_t>(server.process.pid()));
  EXPECT_NE(who.getPid(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(who.getIncarnation(), server.incarnation);
}

TEST(MultiProcess, AnActorsExceptionCrossesProcesses) {
  test::TestServer server;
  EventLoop loop;
  auto calc = ActorRef<Calculator>::connect(loop, server.address.c_str(), "calc");
  try {
    calc.call([](Calculator::Client c) {
          auto q = c.divideRequest();
          q.setA(1);
          q.setB(0);
          return q.send();
        })
        .wait(loop.waitScope());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::FAILED);
    EXPECT_NE(strstr(e.getDescription().cStr(), "division by zero"), nullptr)
        << e.getDescription().cStr();
  }
}

TEST(MultiProcess, ASigkilledServerFailsTheCallInFlightWithMayHaveRun) {
  test::TestServer server;
  EventLoop loop;
  auto blocker = ActorRef<Blocker>::connect(loop, server.address.c_str(), "blocker");
  auto held = test::holdStarted(blocker, "x", 1, loop.waitScope());
  server.process.kill(SIGKILL);
  // Its connection gone, the call tries the address again, finds nothing there and gives up.
  try {
    held.wait(loop.waitScope());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::MAY_HAVE_RUN) << e.getDescription().cStr();
    EXPECT_FALSE(callNeverRan(errorCode(e)));
  }
  // Once the process is gone nothing listens, and the next call cannot connect.
  server.process.wait();
  try {
    blocker.call([](Blocker::Client c) { return c.statsRequest().send(); }).wait(loop.waitScope());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::UNREACHABLE) << e.getDescription().cStr();
    EXPECT_TRUE(callNeverRan(errorCode(e)));
  }
}

TEST(MultiProcess, ACallerKilledMidCallHasItsCallCancelledOnTheServer) {
  // The call waits that long for its caller to come back before it is cancelled.
  test::TestServer server({"--reconnect-window-ms", "200"});
  // A second process makes a call that blocks, then dies with it in flight.
  {
    test::ChildProcess caller(TROUPE_TEST_CALLER_PATH, {server.address, "hold"});
    ASSERT_EQ(caller.readLine(), "HOLDING");
    caller.kill(SIGKILL);
    caller.wait();
  }
  EventLoop loop;
  auto blocker = ActorRef<Blocker>::connect(loop, server.address.c_str(), "blocker");
  blocker
      .call([](Blocker::Client c) {
        auto q = c.waitCancelledRequest();
        q.setCount(1);
        return q.send();
      })
      .wait(loop.waitScope());
  auto stats = blocker.call([](Blocker::Client c) { return c.statsRequest().send(); })
                   .wait(loop.waitScope());
  EXPECT_EQ(stats.getStarted(), 1u);
  EXPECT_EQ(stats.getCancelled(), 1u);
  EXPECT_EQ(stats.getFinished(), 0u);
}

TEST(MultiProcess, AfterARestartTheRefReconnectsToTheNewIncarnation) {
  auto path = socketPath("restart");
  KJ_DEFER(::unlink(path.c_str()));  // the last server is killed, not stopped: its socket stays
  auto address = "unix:" + path;
  EventLoop loop;
  auto echo = ActorRef<Echo>::connect(loop, address.c_str(), "echo");
  uint64_t first;
  {
    test::TestServer server({"--listen", address});
    first = whoami(echo).wait(loop.waitScope()).getIncarnation();
    EXPECT_EQ(first, server.incarnation);
    EXPECT_EQ(KJ_ASSERT_NONNULL(echo.incarnation()), first);
    server.process.kill(SIGTERM);
    EXPECT_EQ(server.process.wait(), 0);  // drained and exited cleanly
  }
  // The old connection is gone; the first call after it fails: without having run when the
  // handle saw the connection end before it sent the call, else as one that may have run (it
  // was written to a connection the server had closed, which no one can tell from one that
  // broke after the server read it).
  try {
    whoami(echo).wait(loop.waitScope());
  } catch (const kj::Exception& e) {
    auto code = errorCode(e);
    EXPECT_TRUE(code == ErrorCode::UNREACHABLE || code == ErrorCode::MAY_HAVE_RUN)
        << e.getDescription().cStr();
  }
  test::TestServer restarted({"--listen", address});
  auto who = whoami(echo).wait(loop.waitScope());
  EXPECT_EQ(who.getIncarnation(), restarted.incarnation);
  EXPECT_GT(who.getIncarnation(), first);
  EXPECT_EQ(KJ_ASSERT_NONNULL(echo.incarnation()), restarted.incarnation);
  EXPECT_EQ(echo.ping().wait(loop.waitScope()), restarted.incarnation);
}

TEST(MultiProcess, SigtermDrainsRefusesNewCallsAndExitsZero) {
  test::TestServer server({"--grace-ms", "200"});
  EventLoop loop;
  auto blocker = ActorRef<Blocker>::connect(loop, server.address.c_str(), "blocker");
  auto held = test::holdStarted(blocker, "stuck", 1, loop.waitScope());
  server.process.kill(SIGTERM);
  // The server reports its endpoints draining (the test server prints the changes).
  std::string line;
  do {
    line = server.process.readLine();
  } while (!line.empty() && line != "ENDPOINT test/blocker-0 draining");
  ASSERT_EQ(line, "ENDPOINT test/blocker-0 draining");
  // New calls are refused; they never ran.
  try {
    blocker.call([](Blocker::Client c) { return c.statsRequest().send(); }).wait(loop.waitScope());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::DRAINING) << e.getDescription().cStr();
  }
  // The call still in flight when the grace period ends loses its connection, and the server
  // is gone when it tries again.
  try {
    held.wait(loop.waitScope());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::MAY_HAVE_RUN) << e.getDescription().cStr();
  }
  int status = server.process.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace troupe
