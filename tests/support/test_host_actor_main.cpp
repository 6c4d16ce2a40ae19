// A replica written the way users write one: hostActor() with everything from the environment.
// Hosts "member" (answers whoami with its endpoint name).

#include <spdlog/spdlog.h>

#include "troupe/resolver/host_actor.h"
#include "tests/support/test_actors.h"

int main() {
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  auto name = troupe::JobContext::fromEnvironment().endpointName("member");
  return troupe::hostActor<troupe::test::Member>(loop, "member",
                                                 kj::heap<troupe::test::MemberImpl>(name));
}
