// A caller for multi-process tests: connects to the test server at argv[1], starts a call to
// blocker.hold that never returns, prints "HOLDING" once the server has started it, and waits
// (the test kills it with the call in flight). With "flood", keeps four echo calls of BYTES
// in flight, one after another, and prints "FLOODING" once the first has come back whole (the
// test kills it mid-transfer).
//
//   troupe_test_caller ADDRESS hold
//   troupe_test_caller ADDRESS flood BYTES

#include <stdio.h>
#include <string.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/base/parse_number.h"
#include "tests/support/test_actors.h"

namespace {

// Echo calls of `bytes`, one after another, until the process is killed.
kj::Promise<void> flood(troupe::ActorRef<troupe::test::Echo>& echo, size_t bytes, bool& first) {
  auto call = echo.call([bytes](troupe::test::Echo::Client c) {
    auto q = c.echoRequest();
    auto payload = q.initPayload(bytes);
    memset(payload.begin(), 0x5a, payload.size());
    return q.send();
  });
  return call.then([&echo, bytes, &first](auto&& reply) {
    KJ_ASSERT(reply.getPayload().size() == bytes);
    if (first) {
      first = false;
      printf("FLOODING\n");
      fflush(stdout);
    }
    return flood(echo, bytes, first);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && kj::StringPtr(argv[2]) == "flood") {
    troupe::EventLoop loop;
    auto echo = troupe::ActorRef<troupe::test::Echo>::connect(loop, argv[1], "echo");
    bool first = true;
    auto bytes = KJ_ASSERT_NONNULL(troupe::parseWholeNumber(kj::StringPtr(argv[3])), argv[3]);
    kj::Vector<kj::Promise<void>> calls;
    for (int i = 0; i < 4; ++i) calls.add(flood(echo, bytes, first));
    kj::joinPromises(calls.releaseAsArray()).wait(loop.waitScope());
    return 0;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: %s ADDRESS hold | ADDRESS flood BYTES\n", argv[0]);
    return 2;
  }
  troupe::EventLoop loop;
  auto blocker = troupe::ActorRef<troupe::test::Blocker>::connect(loop, argv[1], "blocker");
  auto held = troupe::test::holdStarted(blocker, "from-caller", 1, loop.waitScope());
  printf("HOLDING\n");
  fflush(stdout);
  held.wait(loop.waitScope());
  return 0;
}
