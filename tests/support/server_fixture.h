#pragma once
// A test fixture with an ActorServer and its clients on one loop, over real sockets on port 0.
// It hosts "calc" (ScientificCalculator), "echo", "blocker" (a Blocker admitting any number of
// concurrent calls) and "serial" (a Blocker with the default one-at-a-time admission).

#include <gtest/gtest.h>
#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "tests/support/test_actors.h"

namespace troupe::test {

// Records what an ActorServer reports about its endpoints.
class RecordingListener final : public EndpointListener {
public:
  void endpointChanged(const Endpoint& e) override {
    events.add(kj::str(e.name.c_str(), " ", toString(e.state)));
  }
  void endpointRemoved(const Endpoint& e) override {
    events.add(kj::str(e.name.c_str(), " removed"));
  }
  kj::Vector<kj::String> events;
};

class ServerFixture : public ::testing::Test {
protected:
  // `loopOptions` for the loop server and clients share (a manual clock, say).
  explicit ServerFixture(EventLoopOptions loopOptions = {}) : loop(kj::mv(loopOptions)) {
    JobContext job;
    job.jobId = "job-1";
    job.taskIndex = 3;
    job.numTasks = 4;
    server = kj::heap<ActorServer>(loop, job,
                                   ActorServerOptions{.drainGracePeriod = 5 * kj::SECONDS});
    server->host<ScientificCalculator>("calc", kj::heap<CalculatorImpl>());
    server->host<Echo>("echo", kj::heap<EchoImpl>());
    server->host<Blocker>("blocker", kj::heap<BlockerImpl>(blocker), {.maxConcurrency = 0});
    server->host<Blocker>("serial", kj::heap<BlockerImpl>(serial));
    address = server->listen("tcp://127.0.0.1:0");
  }
  ~ServerFixture() noexcept override {}

  template <typename T>
  ActorRef<T> ref(kj::StringPtr actor) {
    return ActorRef<T>::connect(loop, address.c_str(), actor);
  }

  kj::Promise<capnp::Response<Blocker::HoldResults>> hold(ActorRef<Blocker>& b, kj::StringPtr tag,
                                                          CallOptions options = {}) {
    return b.call(
        [tag](Blocker::Client c) {
          auto r = c.holdRequest();
          r.setTag(tag);
          return r.send();
        },
        options);
  }

  kj::WaitScope& ws() { return loop.waitScope(); }

  // One echo round trip on a fresh connection: the server still serves.
  void expectServing() {
    auto echo = ref<Echo>("echo");
    auto r = echo.call([](Echo::Client c) {
                   auto q = c.echoRequest();
                   q.setPayload(kj::StringPtr("still here").asBytes());
                   return q.send();
                 })
                 .wait(ws());
    EXPECT_EQ(kj::StringPtr(reinterpret_cast<const char*>(r.getPayload().begin()),
                            r.getPayload().size()),
              "still here");
  }

  // Runs the loop without blocking until `done()` holds; false if it never does. Client and
  // server share this loop and loopback delivers at once, so whatever was sent is processed.
  template <typename Fn>
  bool pollUntil(Fn&& done) {
    for (int i = 0; i < 1000; ++i) {
      if (done()) return true;
      ws().poll();
    }
    return done();
  }

  EventLoop loop;
  BlockerState blocker;
  BlockerState serial;
  kj::Own<ActorServer> server;
  std::string address;
};

}  // namespace troupe::test
