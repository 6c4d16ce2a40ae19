#include "troupe/resolver/host_actor.h"

#include <stdio.h>
#include <stdlib.h>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/resolver/endpoint_publisher.h"
#include "troupe/resolver/open_resolver.h"

namespace troupe {

namespace {

// refuseOpenListener() for `address`, unless TROUPE_INSECURE=1.
void refuseIfOpen(ActorServer& server, kj::StringPtr address) {
  const char* insecure = ::getenv("TROUPE_INSECURE");
  if (insecure != nullptr && kj::StringPtr(insecure) == "1") return;
  refuseOpenListener(Address::parse(address), server.credentials(), "TROUPE_INSECURE=1");
}

}  // namespace

std::string listenGuarded(ActorServer& server, kj::StringPtr address) {
  refuseIfOpen(server, address);
  return server.listen(address);
}

kj::Own<PublishedReplica> publishReplica(EventLoop& loop, ActorServer& server) {
  auto& job = server.job();
  if (server.state() == ServerState::STARTING) {
    listenGuarded(server, server.defaultListenAddress().c_str());
  } else {
    for (auto& address : server.listenAddresses()) refuseIfOpen(server, address.c_str());
  }
  auto replica = kj::heap<PublishedReplica>();
  if (job.resolver.empty()) {
    loop.logger()->info("serving {} without a resolver (TROUPE_RESOLVER is not set)",
                        server.listenAddresses()[0]);
    return replica;
  }
  replica->resolver = openResolver(loop, job.resolver);
  replica->publisher = kj::heap<EndpointPublisher>(server, *replica->resolver);
  replica->publisher->whenPublished().wait(loop.waitScope());
  loop.logger()->info("published {} endpoint(s) of job '{}' task {} in {}",
                      server.endpoints().size(), job.jobId, job.taskIndex, job.resolver);
  return replica;
}

PublishedReplica::~PublishedReplica() noexcept(false) = default;

void serveReplica(EventLoop& loop, ActorServer& server) {
  auto replica = publishReplica(loop, server);
  server.serveUntilSignal();
  // The drain already removed the endpoints; dropping the publisher releases the leases.
}

namespace resolver_detail {

int hostCapability(EventLoop& loop, kj::StringPtr name, capnp::InterfaceSchema schema,
                   capnp::Capability::Client actor, HostOptions options) {
  auto& log = loop.logger();
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                ActorServer server(loop, JobContext::fromEnvironment(), kj::mv(options.server));
                server.hostCapability(name, schema, kj::mv(actor), options.actor);
                if (!options.listen.empty()) listenGuarded(server, options.listen.c_str());
                serveReplica(loop, server);
              })) {
    log->error("replica hosting '{}' stopped: {}", name.cStr(), e->getDescription().cStr());
    return 1;
  }
  return 0;
}

}  // namespace resolver_detail

}  // namespace troupe
