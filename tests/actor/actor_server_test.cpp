// ActorServer and ActorRef in one process: server and clients share one loop and talk over real
// sockets on port 0.

#include "troupe/actor/actor_server.h"

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/base/errors.h"
#include "tests/support/server_fixture.h"

namespace troupe {
namespace {

using test::Blocker;
using test::Calculator;
using test::Echo;
using test::ScientificCalculator;

using ActorServerTest = test::ServerFixture;

TEST_F(ActorServerTest, CallReturnsTheActorsResult) {
  auto calc = ref<Calculator>("calc");
  auto r = calc.call([](Calculator::Client c) {
                 auto q = c.addRequest();
                 q.setA(40);
                 q.setB(2);
                 return q.send();
               })
               .wait(ws());
  EXPECT_EQ(r.getSum(), 42);
  EXPECT_EQ(KJ_ASSERT_NONNULL(calc.incarnation()), server->incarnation());
}

TEST_F(ActorServerTest, ListsHostedActorsWithTheirMethods) {
  auto channel = Channel::open(loop, address.c_str());
  auto list = channel->host().listActorsRequest().send().wait(ws());
  EXPECT_EQ(list.getIncarnation(), server->incarnation());
  auto actors = list.getActors();
  ASSERT_EQ(actors.size(), 4u);
  EXPECT_EQ(actors[0].getName(), "calc");
  EXPECT_EQ(actors[0].getInterfaceId(), capnp::typeId<ScientificCalculator>());
  EXPECT_TRUE(kj::StringPtr(actors[0].getInterfaceName()).endsWith(":ScientificCalculator"));
  kj::Vector<kj::String> methods;
  for (auto m : actors[0].getMethods()) methods.add(kj::str(m));
  // Its own method and the ones it inherits.
  EXPECT_EQ(kj::strArray(methods, ","), "sqrt,add,divide");
  EXPECT_EQ(actors[1].getName(), "echo");
  EXPECT_EQ(actors[1].getMethods().size(), 2u);
  EXPECT_EQ(actors[2].getName(), "blocker");
  EXPECT_EQ(actors[3].getName(), "serial");
}

TEST_F(ActorServerTest, EndpointsFollowTheNamingScheme) {
  auto endpoints = server->endpoints();
  ASSERT_EQ(endpoints.size(), 4u);
  EXPECT_EQ(endpoints[0].name, "job-1/calc-3");
  EXPECT_EQ(endpoints[0].jobId, "job-1");
  EXPECT_EQ(endpoints[0].actor, "calc");
  EXPECT_EQ(endpoints[0].taskIndex, 3u);
  EXPECT_EQ(endpoints[0].address, address);
  EXPECT_EQ(endpoints[0].incarnation, server->incarnation());
  EXPECT_EQ(endpoints[0].state, EndpointState::READY);
  EXPECT_EQ(endpoints[3].name, "job-1/serial-3");
}

TEST_F(ActorServerTest, ActorExceptionReachesTheCallerAsFailedWithItsMessage) {
  auto calc = ref<Calculator>("calc");
  auto p = calc.call([](Calculator::Client c) {
    auto q = c.divideRequest();
    q.setA(7);
    q.setB(0);
    return q.send();
  });
  try {
    p.wait(ws());
    FAIL() << "division by zero should fail";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(e.getType(), kj::Exception::Type::FAILED);
    EXPECT_EQ(errorCode(e), ErrorCode::FAILED);
    EXPECT_NE(e.getDescription().findFirst('z'), nullptr);
    EXPECT_TRUE(kj::StringPtr(e.getDescription()).endsWith("division by zero; p.getA() = 7"))
        << e.getDescription().cStr();
  }
  // The server keeps serving this caller.
  auto r = calc.call([](Calculator::Client c) {
                 auto q = c.divideRequest();
                 q.setA(9);
                 q.setB(3);
                 return q.send();
               })
               .wait(ws());
  EXPECT_EQ(r.getQuotient(), 3);
}

TEST_F(ActorServerTest, UnknownActorIsActorNotFoundAndNamesWhatIsHosted) {
  auto nope = ref<Calculator>("nope");
  try {
    nope.call([](Calculator::Client c) { return c.addRequest().send(); }).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::ACTOR_NOT_FOUND) << e.getDescription().cStr();
    EXPECT_TRUE(callNeverRan(errorCode(e)));
    kj::StringPtr text = e.getDescription();
    EXPECT_NE(text.findFirst('\''), nullptr);
    EXPECT_TRUE(strstr(text.cStr(), "calc, echo, blocker, serial") != nullptr) << text.cStr();
  }
}

TEST_F(ActorServerTest, UnknownMethodIsUnimplemented) {
  // "echo" does not implement Calculator.
  auto wrong = ref<Calculator>("echo");
  try {
    wrong.call([](Calculator::Client c) { return c.addRequest().send(); }).wait(ws());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::UNIMPLEMENTED) << e.getDescription().cStr();
  }
  // The connection is still good.
  auto echo = ref<Echo>("echo");
  auto r = echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws());
  EXPECT_GT(r.getPid(), 0u);
}

TEST_F(ActorServerTest, BadNamesAndAddressesAreInvalidArguments) {
  auto expectInvalid = [](auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "expected INVALID_ARGUMENT";
    } catch (const kj::Exception& e) {
      EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << e.getDescription().cStr();
    }
  };
  expectInvalid([&]() { server->host<Echo>("bad/name", kj::heap<test::EchoImpl>()); });
  expectInvalid([&]() { server->host<Echo>("", kj::heap<test::EchoImpl>()); });
  expectInvalid([&]() { server->host<Echo>("tab\there", kj::heap<test::EchoImpl>()); });
  expectInvalid([&]() { server->host<Echo>("echo", kj::heap<test::EchoImpl>()); });  // taken
  expectInvalid([&]() { ActorRef<Echo>::connect(loop, address.c_str(), "a b"); });
  expectInvalid([&]() { ActorRef<Echo>::connect(loop, "tcp://127.0.0.1", "echo"); });
  expectInvalid([&]() { ActorRef<Echo>::connect(loop, "http://x:1", "echo"); });
  expectInvalid([&]() { server->listen("tcp://127.0.0.1:99999"); });
}

TEST_F(ActorServerTest, ListeningOnATakenPortIsAddressInUse) {
  try {
    server->listen(address.c_str());
    FAIL();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::ADDRESS_IN_USE) << e.getDescription().cStr();
  }
  // Still serving on the original listener.
  auto echo = ref<Echo>("echo");
  EXPECT_GT(echo.call([](Echo::Client c) { return c.whoamiRequest().send(); }).wait(ws()).getPid(),
            0u);
}

TEST(ActorServerIncarnation, ServersMadeInTheSameInstantStillGetNewerIncarnations) {
  // On a manual clock that does not move, the calendar says the same time to both.
  EventLoop loop({.manualClock = true});
  JobContext job;
  job.jobId = "job-1";
  ActorServer first(loop, job);
  ActorServer second(loop, job);
  EXPECT_GT(second.incarnation(), first.incarnation());
  loop.advanceTime(1 * kj::SECONDS);
  ActorServer later(loop, job);
  EXPECT_GE(later.incarnation(),
            static_cast<uint64_t>((loop.calendarNow() - kj::UNIX_EPOCH) / kj::NANOSECONDS));
}

}  // namespace
}  // namespace troupe
