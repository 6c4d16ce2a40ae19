#pragma once
// One in-process replica for the pool tests: an ActorServer of a job hosting "member" and
// "blocker", published in a resolver, listening on tcp://127.0.0.1:0.

#include <kj/string.h>

#include "troupe/actor/actor_server.h"
#include "troupe/resolver/endpoint_publisher.h"
#include "troupe/resolver/resolver.h"
#include "tests/support/test_actors.h"

namespace troupe::test {

struct PoolReplica {
  PoolReplica(EventLoop& loop, Resolver& resolver, uint32_t index, kj::StringPtr job = "job-1") {
    JobContext ctx;
    ctx.jobId = job.cStr();
    ctx.taskIndex = index;
    ctx.numTasks = 100;
    server = kj::heap<ActorServer>(loop, ctx,
                                   ActorServerOptions{.drainGracePeriod = 2 * kj::SECONDS});
    auto impl = kj::heap<MemberImpl>(ctx.endpointName("member"));
    member = impl.get();
    server->host<Member>("member", kj::mv(impl));
    server->host<Blocker>("blocker", kj::heap<BlockerImpl>(blocker), {.maxConcurrency = 0});
    publisher = kj::heap<EndpointPublisher>(*server, resolver);
    server->listen("tcp://127.0.0.1:0");
  }
  BlockerState blocker;
  MemberImpl* member;
  kj::Own<ActorServer> server;
  kj::Own<EndpointPublisher> publisher;
};

}  // namespace troupe::test
