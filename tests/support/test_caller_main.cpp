// A caller for multi-process tests: connects to the test server at argv[1], starts a call to
// blocker.hold that never returns, prints "HOLDING" once the server has started it, and waits
// (the test kills it with the call in flight).
//
//   troupe_test_caller ADDRESS hold

#include <stdio.h>

#include "troupe/actor/actor_ref.h"
#include "tests/support/test_actors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ADDRESS hold\n", argv[0]);
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
